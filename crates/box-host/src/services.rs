//! The host's live services: what its sessions share that changes while it
//! runs (the backend, the ledger of units, metrics, the audit log, the
//! state store, the sessions waiting to be reattached and the dead hosts'
//! instances held for them, the redaction scratch, the egress proxies'
//! runtime, the tool lists units read at start, the key request states are sealed with, and the flags of how the host is ending). One value, owned by
//! the host ([`crate::Host`], or `box run`'s own) and handed to every
//! session beside its settings ([`crate::HostConfig`]); nothing of it is
//! process-wide, so two hosts in one process (tests) share nothing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use box_backend::Backend;
use box_policy::plan::Plan;
use serde_json::Value;

use crate::{audit, egress, ledger, metrics, pool, redact, request_state, state};

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
    /// The tool lists workspace units read at start, by what they were
    /// started for: a stateless `tools/list` without a handle is answered
    /// from here, starting no unit.
    pub tool_lists: ToolLists,
    /// The key the `requestState`s of "input required" answers are sealed
    /// with (MCP 2026-07-28's MRTR, `session/input.rs`).
    pub state_key: request_state::StateKey,
    /// Where spans go: off (nothing recorded) unless the host exports traces.
    pub tracer: box_otel::Tracer,
}

/// How many plans' tool lists a host keeps (the oldest goes first): a host
/// serves a few profiles, each with a few asks.
const TOOL_LISTS_KEPT: usize = 32;

/// The tool list a workspace unit answered at start, by its plan and the
/// client's `maxReadBytes` ask (all the executor's list depends on: its
/// tools and the read limit their descriptions name). Read from a unit,
/// not built by the host: the list is the executor's (its version in the
/// unit's image), and the one a session reads at start is the one its
/// client sees (security case E67).
#[derive(Default)]
pub struct ToolLists {
    kept: Mutex<VecDeque<(Plan, Option<u64>, Value)>>,
}

impl ToolLists {
    /// The list a workspace unit of `plan` read, if one was started here.
    pub fn get(&self, plan: &Plan, max_read_bytes: Option<u64>) -> Option<Value> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter()
            .find(|(kept, bytes, _)| *bytes == max_read_bytes && kept == plan)
            .map(|(_, _, tools)| tools.clone())
    }

    /// Keep the list a workspace unit of `plan` read at start.
    pub fn keep(&self, plan: &Plan, max_read_bytes: Option<u64>, tools: &Value) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|(kept, bytes, _)| !(*bytes == max_read_bytes && kept == plan));
        if kept.len() >= TOOL_LISTS_KEPT {
            kept.pop_front();
        }
        kept.push_back((plan.clone(), max_read_bytes, tools.clone()));
    }
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
            tool_lists: ToolLists::default(),
            state_key: request_state::StateKey::random(),
            tracer: box_otel::Tracer::off(),
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
            proxies: self.proxies(),
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
