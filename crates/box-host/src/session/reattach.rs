//! A session a dead (or handed-off) host served, reattached: the way in of
//! an `initialize` whose box ask carries `reattach: {session, secret}`. The
//! units were re-adopted when this host started (`crate::state`); here the
//! secret is proven, the ask compared with what was persisted, and the
//! session served again with its calls in flight at the restart said to
//! have an unknown outcome.

use std::time::{Duration, Instant};

use box_jsonrpc::code;
use box_policy::plan::{Role, WorkspaceSource};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::Session;
use super::handshake::{StartError, set_box_field};
use super::live::{EVENT_QUEUE, Live, Unit, link_unit};
use crate::ask::{Ask, Reattach, executor_initialize_params};
use crate::redact;
use crate::router::Router;
use crate::state;
use crate::units::{ExecutorLink, FIRST_REQUEST_ID};

impl Session {
    /// Reattach to a session a dead host served, whose units this host
    /// re-adopted at start: the secret proven, the client's ask the same as
    /// persisted, every unit live. Refused loudly otherwise, naming what
    /// differs; the units are never replaced by fresh ones.
    pub(super) async fn reattach(
        &self,
        client_params: Option<&Map<String, Value>>,
        ask: &Ask,
        reattach: Reattach,
        version: &'static str,
    ) -> Result<(Live, Value), StartError> {
        let refuse = |message: String| StartError {
            code: code::INVALID_PARAMS,
            message,
            data: Some(json!({"field": "box.reattach"})),
            refusal: Some("reattach"),
        };
        if reattach.session != self.id {
            return Err(refuse(format!(
                "box.reattach.session: `{}` is not this session (`{}`); reattach with an initialize that carries no Mcp-Session-Id (HTTP) or is the first message of a new `box serve --state` (stdio)",
                reattach.session, self.id
            )));
        }
        let Some(adopted) = self.services.reattachable.take(&self.id) else {
            return Err(refuse(format!(
                "box.reattach: no session `{}` waits to be reattached on this host (it ended, was never kept, its host is alive, or its units were lost); initialize a new session",
                self.id
            )));
        };
        if !state::secret_matches(&reattach.secret, &adopted.record.secret_sha256) {
            // An attacker guessing must not end the session for its owner.
            self.services.reattachable.insert(adopted);
            return Err(refuse(format!(
                "box.reattach.secret: not the secret of session `{}`",
                self.id
            )));
        }
        let forget = || {
            if let Some(store) = &self.services.state {
                store.remove(&self.id);
            }
        };
        // The client's ask must be the session's: what differs is named, and
        // the session keeps waiting for an ask that matches.
        let record = &adopted.record;
        let differs = match (&ask.profile, &ask.tighten) {
            (Some(profile), _) if profile != &record.profile => Some(format!(
                "box.profile: the session runs profile `{}`, the reattach asks for `{profile}`",
                record.profile
            )),
            (_, tighten) if !tighten.is_null() && tighten != &record.tighten => Some(format!(
                "box.tighten: the session runs with tightening {}, the reattach asks for {tighten}",
                record.tighten
            )),
            _ if version != record.protocol_version => Some(format!(
                "protocolVersion: the session's executors speak {}, the reattach agreed {version}; ask for {}",
                record.protocol_version, record.protocol_version
            )),
            _ => None,
        };
        if let Some(differs) = differs {
            self.services.reattachable.insert(adopted);
            return Err(refuse(differs));
        }
        let state::Adopted {
            record,
            units: reattached,
        } = adopted;
        let state::Reattached {
            plan,
            profile,
            units: started,
            egress,
        } = match reattached {
            Ok(reattached) => reattached,
            Err(why) => {
                forget();
                return Err(refuse(format!(
                    "session `{}` cannot be reattached: {why}; its units are left to their leases",
                    self.id
                )));
            }
        };
        for spec in &plan.units {
            if let WorkspaceSource::Host(path) = &spec.source
                && !path.is_dir()
            {
                forget();
                state::leave_to_lease(started);
                return Err(refuse(format!(
                    "unit {}: its workspace {} is gone; the session cannot be reattached and its units are left to their leases",
                    spec.name,
                    path.display()
                )));
            }
        }
        let mut persisted_secrets = Vec::new();
        // The credentials persisted in the workspace, read again: they are
        // redacted from what the units send as they were before the restart.
        if let Some(path) = plan
            .units
            .iter()
            .find_map(|unit| match (&unit.role, &unit.source) {
                (Role::Workspace, WorkspaceSource::Host(path)) => Some(path.clone()),
                _ => None,
            })
        {
            let session = self.id.clone();
            let persisted =
                tokio::task::spawn_blocking(move || redact::scan_persisted(&session, &path))
                    .await
                    .unwrap_or_default();
            persisted_secrets = persisted.secrets;
        }
        let (redactor, label) = self.redactor_and_label(&plan, persisted_secrets)?;
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let mut tasks = JoinSet::new();
        let mut units = Vec::new();
        for (index, ((unit, spec), persisted)) in started
            .into_iter()
            .zip(plan.units.iter().cloned())
            .zip(&record.units)
            .enumerate()
        {
            let key = self.services.ledger.starting(&self.id, &spec.name);
            self.services.ledger.started(key, &unit.envelope.id);
            let link = ExecutorLink::new(unit.io.stdin, unit.io.stdout);
            let writer = link_unit(index, link, unit.ended, &events_tx, &mut tasks);
            units.push(Unit {
                key,
                spec,
                envelope: unit.envelope,
                writer: Some(writer),
                ended: None,
                closed: false,
                close_reason: None,
                draining: None,
                tools: persisted.tools.clone(),
                _renewal: unit.renewal,
                fork: None,
                removed: false,
            });
        }
        let workspace = units
            .iter()
            .position(|unit| unit.spec.role == Role::Workspace);
        let mut result = record.initialize.clone();
        let envelopes: Vec<Value> = units
            .iter()
            .map(|unit| {
                let mut envelope = serde_json::to_value(&unit.envelope).unwrap_or(Value::Null);
                envelope["reattached"] = json!(true);
                if unit.spec.network.mode == box_policy::plan::NetworkMode::Egress
                    && let Some(network) = envelope.get_mut("network")
                {
                    // A `box/network.set` narrowing is not persisted: the new
                    // proxy enforces the profile's list, and says so.
                    network["restored"] = json!(
                        "the egress proxy was served again by this host with the profile's allow list: a narrowing made with box/network.set before the restart is not kept; narrow it again"
                    );
                }
                envelope
            })
            .collect();
        set_box_field(&mut result, "units", json!(envelopes));
        set_box_field(&mut result, "reattached", json!(true));
        // The calls in flight when the host died: their outcome is unknown
        // (they may have run, in part or in full); said by the client's id.
        let store = self.services.state.as_ref();
        let unsettled = store.map_or_else(Vec::new, |store| {
            store.unsettled_calls(&self.id, &record.units)
        });
        let unknown: Vec<Value> = unsettled.iter().map(|(_, _, call)| call.clone()).collect();
        // Their answers, should the units still give them, reach the client
        // as `notifications/box/lateAnswer` (this host's ids start far above).
        let late: std::collections::HashMap<(usize, u64), Value> = unsettled
            .into_iter()
            .map(|(unit, unit_id, call)| ((unit, unit_id), call))
            .collect();
        if !unknown.is_empty() {
            tracing::info!(session = %self.id, calls = unknown.len(), "calls in flight at the restart have an unknown outcome");
        }
        set_box_field(&mut result, "unknownOutcome", json!(unknown));
        let journal = store.and_then(|store| store.journal(&self.id));
        set_box_field(
            &mut result,
            "session",
            json!({"id": self.id, "secret": reattach.secret}),
        );
        redactor.message(&mut result);
        // This host serves the session now: a later restart finds it here.
        if let Some(store) = &self.services.state {
            let mut kept = record.clone();
            kept.instance = self.config.instance.clone();
            if let Err(why) = store.write(&kept) {
                tracing::warn!(session = %self.id, %why, "updating the session's identity");
            }
        }
        let _ = self.version.set(version);
        tracing::info!(session = %self.id, profile = %plan.profile, units = units.len(), "session reattached");
        self.services.metrics.session_reattached(units.len());
        let executor_params = executor_initialize_params(client_params, ask, version);
        self.watch_limits(&units, &egress);
        let count = units.len();
        // Ids the dead host used may still be answered by the units: this
        // host's start far above them (seconds since the epoch, shifted), so
        // a late answer never matches a request of this host's.
        // Its lifetime counts from its first start, not from the restart.
        let age = Duration::from_millis(state::unix_ms().saturating_sub(record.started_unix_ms));
        let started = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let first_id = FIRST_REQUEST_ID
            + (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs())
                << 20);
        Ok((
            Live {
                plan,
                units,
                workspace,
                router: Router::new(count, first_id),
                events_tx,
                events_rx,
                tasks,
                last_activity: Instant::now(),
                started,
                redactor,
                egress,
                executor_params,
                label,
                next_fork: 1,
                profile,
                tighten: record.tighten.clone(),
                masks: None,
                journal,
                late,
                input_rounds: 0,
                opened: None,
                input_answers: Default::default(),
                mcp_tasks: Vec::new(),
                client: None,
                handle: None,
                trace: Default::default(),
            },
            result,
        ))
    }
}
