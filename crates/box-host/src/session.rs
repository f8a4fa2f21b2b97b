//! One session: a task that owns everything about it, in three phases.
//!
//! - **The handshake** (`handshake.rs`): before the session is open it
//!   answers only `ping` and `server/discover` (a probe never starts units;
//!   method not found without the stateless revision's `_meta`), until a way
//!   in opens it (`box/session.open` and a stateless request without a
//!   handle too: `stateless.rs`): `initialize` starts a
//!   fresh session (`start.rs`: the profile resolved and tightened, every
//!   unit started, all or nothing, within the profile's `start_timeout`,
//!   their executors initialized) or reattaches one a dead host served
//!   (`reattach.rs`); the answer carries the workspace unit's capability
//!   plus the envelopes.
//! - **The routing loop** (`route.rs`, `answer.rs`): every message is routed
//!   through the proxy's [`Router`](crate::router::Router) between the
//!   client and the units, or answered by the host (`box/fork`, `box/merge`,
//!   `box/discard` in `forks.rs`), until the session ends (the client leaves,
//!   the transport ends it, idle, lifetime, host shutdown).
//! - **The end** (`Session::finish`): the units' executors end (their
//!   processes end with them) and the units are removed. The session is over
//!   only once every unit it asked for is confirmed removed (the host's
//!   ledger names those that are not).
//!
//! What an open session holds is in `live.rs`.

mod answer;
mod forks;
mod handshake;
mod input;
mod limits;
mod live;
mod methods;
mod reattach;
mod route;
mod start;
mod stateless;
mod stats;
mod tasks;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use box_backend::UnitState;
use box_jsonrpc::session::Inbound;
pub use box_jsonrpc::session::{AskPart, SessionGone, SessionHandle, TransportAsk};
use box_jsonrpc::{code, error_response};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::ask::EXECUTOR_KEY;
use crate::fork::{self, ChildFork};
use crate::ledger::{Removal, Tracked};
use crate::units::{describe_end, remove_until_gone};
use crate::{HostConfig, Services};
use live::{Live, UnitEvent};

/// How many client messages may wait for the session task.
const INBOUND_QUEUE: usize = 64;
/// At session end, how long executors get to end their processes and exit
/// after their input closes, before their units are removed anyway.
const SESSION_END_GRACE: Duration = Duration::from_secs(5);

/// The `_meta` key naming the unit a request is for (`fork-1`, `workspace`).
pub const UNIT_META: &str = "box/unit";

/// Start a session task. Messages for the client that belong to no request go
/// to `general`. The session ends when every handle is dropped, when `end` is
/// called, or when `parent` is cancelled.
pub fn spawn_session(
    config: Arc<HostConfig>,
    services: Arc<Services>,
    id: String,
    general: mpsc::Sender<Value>,
    parent: &CancellationToken,
) -> SessionHandle {
    spawn_session_asking(
        config,
        services,
        id,
        general,
        parent,
        TransportAsk::default(),
    )
}

/// [`spawn_session`] for a session whose transport carried an ask (the HTTP
/// path and headers, `box serve --tighten`): at `initialize` it is merged
/// with the client's capability ask (`crate::ask::merge_ask`).
pub fn spawn_session_asking(
    config: Arc<HostConfig>,
    services: Arc<Services>,
    id: String,
    general: mpsc::Sender<Value>,
    parent: &CancellationToken,
    transport_ask: TransportAsk,
) -> SessionHandle {
    spawn(config, services, id, general, parent, transport_ask, false)
}

/// [`spawn_session_asking`] for the session `id` a restarted host kept
/// (`--state`), named by the handle its first request carries (a stateless
/// request, over HTTP): it is reattached for that request, within it (the
/// request's span is the reattach's parent), whatever its method, and the
/// request is then served as an open session's. [`SessionHandle::opened`]
/// tells the transport it was; refused, the request is answered why.
pub fn spawn_session_reattaching(
    config: Arc<HostConfig>,
    services: Arc<Services>,
    id: String,
    general: mpsc::Sender<Value>,
    parent: &CancellationToken,
    transport_ask: TransportAsk,
) -> SessionHandle {
    spawn(config, services, id, general, parent, transport_ask, true)
}

fn spawn(
    config: Arc<HostConfig>,
    services: Arc<Services>,
    id: String,
    general: mpsc::Sender<Value>,
    parent: &CancellationToken,
    transport_ask: TransportAsk,
    reattaching: bool,
) -> SessionHandle {
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
    let cancel = parent.child_token();
    let host = parent.clone();
    let done = CancellationToken::new();
    let opened = CancellationToken::new();
    let version = Arc::new(OnceLock::new());
    let handle = SessionHandle::new(
        id.clone(),
        inbound_tx,
        cancel.clone(),
        done.clone(),
        opened.clone(),
        version.clone(),
    );
    services.metrics.task_started();
    tokio::spawn(async move {
        let session = Session {
            config,
            services: services.clone(),
            id,
            general,
            cancel,
            host,
            background: TaskTracker::new(),
            version,
            opened,
            transport_ask,
            reattaching,
        };
        session.run(inbound_rx).await;
        services.metrics.task_ended();
        done.cancel();
    });
    handle
}

struct Session {
    config: Arc<HostConfig>,
    services: Arc<Services>,
    id: String,
    general: mpsc::Sender<Value>,
    cancel: CancellationToken,
    /// The host's shutdown: when it (not the session alone) ends the session,
    /// calls in flight get `HostConfig::drain` to finish.
    host: CancellationToken,
    /// Removals of units whose start failed or finished late: the session is
    /// not over until they are done.
    background: TaskTracker,
    /// The negotiated protocol version, set once at a successful initialize.
    version: Arc<OnceLock<&'static str>>,
    /// Cancelled once a way in opened the session (`SessionHandle::opened`).
    opened: CancellationToken,
    /// What the transport asked, merged with the capability ask at initialize.
    transport_ask: TransportAsk,
    /// Its first request carries the handle of the session it reattaches
    /// ([`spawn_session_reattaching`]).
    reattaching: bool,
}

impl Session {
    /// Serve the session, then wait until every unit it asked for is
    /// confirmed gone, however it ended.
    async fn run(self, inbound: mpsc::Receiver<Inbound>) {
        self.serve_session(inbound).await;
        self.background.close();
        self.background.wait().await;
        // The children's storage is gone by now; their directory goes too.
        fork::remove_holder(&fork::session_dir(&self.config, &self.id));
    }

    async fn serve_session(&self, mut inbound: mpsc::Receiver<Inbound>) {
        let Some((mut live, first)) = self.handshake(&mut inbound).await else {
            return;
        };
        // The stateless request the session was opened for, its span
        // (under which its units started, or the session was reattached)
        // ended with its answer.
        if let Some((message, reply, span)) = first {
            self.opened_request(&mut live, message, reply, span);
        }
        let why = self.route(&mut live, &mut inbound).await;
        if self.host.is_cancelled()
            && live.journal.is_some()
            && self
                .services
                .handoff
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            // SIGHUP: its calls drained, the session is left to the next
            // host (its units, its state file); this process exits holding
            // them, so nothing closes an executor's input.
            tracing::info!(session = %self.id, "session handed off: its units are left for the next host to re-adopt");
            // Their egress directories too: the units have them mounted and
            // the next host serves their proxies there.
            for proxy in &live.egress {
                proxy.keep_dir();
            }
            drain(
                &mut inbound,
                "the host is handing its sessions to a new process; reattach",
            );
            self.services
                .parked
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        tracing::info!(session = %self.id, why = %why, "session ending");
        drain(&mut inbound, &why);
        self.finish(&mut live, &why).await;
    }

    /// End the session: answer what is in flight, close every executor's input
    /// (their processes end), wait a little for them, then remove every unit.
    async fn finish(&self, live: &mut Live, why: &str) {
        // Ending normally: nothing is left to reattach to.
        if let Some(store) = &self.services.state {
            store.remove(&self.id);
        }
        for unit in 0..live.units.len() {
            for mut forward in live.router.take_all(unit) {
                self.record(live, unit, &mut forward.tag, "session_ended");
                forward.reply.answer(error_response(
                    forward.client_id,
                    code::INTERNAL_ERROR,
                    format!("the session ended: {why}"),
                ));
            }
        }
        for unit in &mut live.units {
            unit.writer = None;
            // Its calls are answered: nothing more to read before its end.
            if let Some(end) = unit.draining.take() {
                unit.ended = Some(describe_end(&end));
            }
        }
        // Ending at once, nothing of the units is waited for: they are removed now.
        let grace = match self.services.removal() {
            Removal::Graceful => SESSION_END_GRACE,
            Removal::AtOnce => Duration::ZERO,
        };
        let deadline = tokio::time::Instant::now() + grace;
        let mut joining = Vec::new();
        // An executor sends its last spans as its input closes: while some
        // are awaited, a unit's output is read to its end, not only to the
        // unit's end (which may be told first).
        let waiting = |live: &Live| {
            live.units.iter().any(|unit| {
                unit.ended.is_none()
                    || (!unit.closed && !unit.removed && !live.trace.executor_parents.is_empty())
            })
        };
        while waiting(live) {
            let event = tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                event = live.events_rx.recv() => event,
            };
            match event {
                Some(UnitEvent::Spans(unit, line)) => self.executor_spans(live, unit, &line),
                Some(UnitEvent::Message(unit, message))
                    if box_otel::is_executor_spans(&message) =>
                {
                    let line = serde_json::to_vec(&message).unwrap_or_default();
                    self.executor_spans(live, unit, &line);
                }
                Some(UnitEvent::Ended(unit, end)) => {
                    if let Some(state) = live.units.get_mut(unit) {
                        state.ended = Some(describe_end(&end));
                    }
                }
                Some(UnitEvent::Grace(unit)) => {
                    if let Some(state) = live.units.get_mut(unit) {
                        state
                            .ended
                            .get_or_insert_with(|| "its executor closed its output".to_owned());
                    }
                }
                Some(UnitEvent::Closed(unit, _)) => {
                    // The session is ending anyway: the output closing is enough.
                    if let Some(state) = live.units.get_mut(unit) {
                        state.closed = true;
                        state
                            .ended
                            .get_or_insert_with(|| "its executor exited".to_owned());
                    }
                }
                Some(UnitEvent::Forked(started)) => joining.push(started),
                Some(_) => {}
                None => break,
            }
        }
        // Units that died during the session were counted then; the rest end here.
        let died = live
            .units
            .iter()
            .filter(|unit| !unit.removed && unit.envelope.state == UnitState::Ended)
            .count();
        let mut tracked: Vec<Tracked> = live
            .units
            .iter()
            .filter(|unit| !unit.removed)
            .map(|unit| Tracked {
                key: unit.key,
                id: unit.envelope.id.clone(),
            })
            .collect();
        // Forks still joining go with the session; later ones remove themselves.
        let mut children: Vec<ChildFork> = live
            .units
            .iter()
            .rev()
            .filter(|unit| !unit.removed)
            .filter_map(|unit| unit.fork.clone())
            .collect();
        live.events_rx.close();
        while let Ok(event) = live.events_rx.try_recv() {
            if let UnitEvent::Forked(started) = event {
                joining.push(started);
            }
        }
        for started in joining {
            {
                let started = *started;
                started.reply.answer(error_response(
                    started.id,
                    code::INTERNAL_ERROR,
                    format!("box/fork: the session ended: {why}"),
                ));
                tracked.push(Tracked {
                    key: started.key,
                    id: started.envelope.id.clone(),
                });
                children.insert(0, started.child);
            }
        }
        let count = tracked.len();
        live.tasks.abort_all();
        // The session is over only once its units are confirmed gone: until
        // then it keeps its place, and the host names them if it exits first.
        // A child of the request that opened the session: its units' life
        // ends in the trace it began in.
        let mut span = self.services.tracer.span(
            box_otel::SpanKind::Internal,
            live.trace.parent.as_ref(),
            || "unit.remove".to_owned(),
        );
        span.set("box.units", count as u64);
        remove_until_gone(&self.services, tracked).await;
        span.end();
        if !children.is_empty() {
            // Children of children first (the newest first).
            let config = self.config.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for child in &children {
                    fork::remove_storage(&config, child);
                }
            })
            .await;
        }
        self.services.metrics.session_ended(count, died);
        tracing::info!(session = %self.id, units = count, "session ended, units removed");
    }
}

/// Answer the requests still queued when a session ends: each gets its one answer.
fn drain(inbound: &mut mpsc::Receiver<Inbound>, why: &str) {
    inbound.close();
    while let Ok(message) = inbound.try_recv() {
        if let Inbound::Request(message, reply) = message {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            reply.answer(error_response(
                id,
                code::INTERNAL_ERROR,
                format!("the session ended: {why}"),
            ));
        }
    }
}

/// Unit names in an error: `` `a`, `b` ``, or `none`.
fn named(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sleep until `when`, or for ever.
async fn sleep_until(when: Option<tokio::time::Instant>) {
    match when {
        Some(when) => tokio::time::sleep_until(when).await,
        None => std::future::pending().await,
    }
}
