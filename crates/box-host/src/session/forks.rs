//! A session's forks: `box/fork` (a child unit on a fork of a workspace
//! unit's directory, started off the session task and joined to it when
//! ready), `box/merge` (the child's changes into its parent, all or
//! nothing), `box/discard` (the child removed), and the workspace of a
//! session whose profile says `source = "fork"` (forked before its units
//! start). The forks' storage (worktrees, copies, merging) is `crate::fork`'s.

use std::sync::Arc;
use std::time::Instant;

use box_backend::UnitState;
use box_jsonrpc::{ReplyTo, code, error_response, error_response_with_data, result_response};
use box_policy::plan::{MountMode, Plan, Role, UnitSpec, WorkspaceSource};
use serde_json::{Value, json};

use super::handshake::StartError;
use super::live::{ForkStarted, Live, Unit, UnitEvent, link_unit};
use super::methods::Request;
use super::{Session, named, tasks};
use crate::HostConfig;
use crate::fork::{self, ChildFork};
use crate::ledger::Tracked;
use crate::units::{
    ExecutorLink, FIRST_REQUEST_ID, StartWiring, initialize_executor, remove_until_gone,
    start_units,
};
use tokio_util::task::TaskTracker;

/// What a `source = "fork"` workspace's parent is called in answers.
const HOST_DIRECTORY: &str = "host directory";

/// Removes a session's workspace fork unless the session started (then the
/// unit holds it and the session's end removes it).
pub(super) struct ForkGuard {
    pub(super) config: Arc<HostConfig>,
    pub(super) child: Option<ChildFork>,
    /// The session's tracker: the session waits for the removal before it
    /// removes its own directory, which the fork was in.
    pub(super) background: TaskTracker,
}

impl Drop for ForkGuard {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let config = self.config.clone();
            self.background
                .spawn_blocking(move || fork::remove_storage(&config, &child));
        }
    }
}

/// A `source = "fork"` session's workspace, forked before its units start.
pub(super) struct WorkspaceFork {
    /// The fork.
    pub(super) child: ChildFork,
    /// A worktree fork's borrowed objects, for the unit.
    pub(super) objects: Option<box_backend::ObjectsWiring>,
    /// What the pools gave its unit (`None`: the host keeps none): a unit
    /// taken, whose directory holds the fork, or why it starts cold.
    pub(super) claim: Option<crate::pool::ForkClaim>,
}

impl Session {
    /// Fork the workspace unit's host directory for this session
    /// (`source = "fork"`) and point the plan's workspace unit at the fork.
    ///
    /// A ready unit of the profile's pool is taken first (`label`, the
    /// session's; `masked`, its credentials hidden): the fork is made into
    /// the directory that unit mounts, and the units' start binds it.
    pub(super) async fn fork_workspace(
        &self,
        plan: &mut Plan,
        mode: box_policy::profile::ForkMode,
        label: &box_backend::SessionLabel,
        masked: bool,
    ) -> Result<WorkspaceFork, StartError> {
        let Some(spec) = plan
            .units
            .iter_mut()
            .find(|unit| unit.role == Role::Workspace)
        else {
            return Err(StartError::internal(
                "workspace.source = \"fork\": the plan has no workspace unit".to_owned(),
            ));
        };
        let WorkspaceSource::Host(parent_path) = spec.source.clone() else {
            return Err(StartError::internal(
                "workspace.source = \"fork\": the workspace unit has no host directory".to_owned(),
            ));
        };
        let asked = fork::asked_mode(mode);
        let backend = self.services.backend.as_ref();
        let mode = fork::effective_mode(&self.config, backend, spec, asked).map_err(|why| {
            StartError::refused("workspace", format!("workspace.fork_mode: {why}"))
        })?;
        let ask = fork::ForkAsk {
            from: "workspace".to_owned(),
            mode: asked,
            dirty: true,
            writable: spec.mode == MountMode::ReadWrite,
            label: None,
            tighten: None,
        };
        // A warm unit's directory, else the session's own.
        let claim = crate::pool::take_fork(self.services.pool_services(), label, spec, masked);
        let (session_dir, child_path, holder) = match &claim {
            Some(crate::pool::ForkClaim::Taken(taken)) => {
                (None, taken.dir.clone(), Some(taken.holder.clone()))
            }
            _ => {
                let session_dir = fork::session_dir(&self.config, &self.id);
                let child_path = session_dir.join("workspace");
                (Some(session_dir), child_path, None)
            }
        };
        let made = {
            let (config, parent_path, child_path) =
                (self.config.clone(), parent_path.clone(), child_path.clone());
            tokio::task::spawn_blocking(move || {
                let existing = session_dir.is_none();
                session_dir
                    .map_or(Ok(()), |dir| fork::make_fork_dir(&config, &dir))
                    .and_then(|()| {
                        fork::make_fork(&config, &parent_path, &child_path, &ask, &mode, existing)
                    })
            })
            .await
            .unwrap_or_else(|join| Err(format!("the fork failed: {join}")))
        };
        let forked = match made {
            Ok(forked) => forked,
            Err(why) => {
                // A taken unit's directory went with the failed fork: the
                // unit goes too.
                if let Some(crate::pool::ForkClaim::Taken(taken)) = &claim {
                    let _ = std::fs::remove_dir_all(&taken.dir);
                    fork::remove_holder(&taken.holder);
                    if let Some(left) = taken.left() {
                        let services = self.services.clone();
                        self.background
                            .spawn(async move { remove_until_gone(&services, vec![left]).await });
                    }
                }
                return Err(StartError::internal(format!(
                    "workspace.source = \"fork\": forking {}: {why}",
                    parent_path.display()
                )));
            }
        };
        if let Some(advisory) = &forked.advisory {
            tracing::warn!(session = %self.id, %advisory, "the session's workspace fork is degraded");
        }
        spec.source = WorkspaceSource::Host(child_path.clone());
        let objects = forked
            .objects
            .as_ref()
            .map(|objects| box_backend::ObjectsWiring {
                host: objects.host.clone(),
            });
        Ok(WorkspaceFork {
            child: ChildFork {
                parent: HOST_DIRECTORY.to_owned(),
                parent_path,
                path: child_path,
                base: Arc::new(std::sync::Mutex::new(forked.base.clone())),
                mode: forked.mode_used,
                shares: forked.shares.clone(),
                label: None,
                holder,
            },
            objects,
            claim,
        })
    }

    /// `box/fork`: check the ask here, then fork, start and initialize the
    /// child in a task of its own (the session goes on meanwhile); the child
    /// joins the session in [`Self::join_fork`], which answers.
    pub(super) fn fork(&self, live: &mut Live, request: Request) {
        let Request {
            id,
            message,
            reply,
            span: request_span,
            ..
        } = request;
        let message = &message;
        let refuse = |reply: ReplyTo, id: Value, why: String| {
            reply.answer(error_response(id, code::INVALID_PARAMS, why));
        };
        let ask = match fork::fork_ask(message) {
            Ok(ask) => ask,
            Err(why) => return refuse(reply, id, why),
        };
        let Some(parent_index) = live.units.iter().position(|unit| {
            unit.spec.role == Role::Workspace && unit.spec.name == ask.from && !unit.removed
        }) else {
            let known: Vec<&str> = live
                .units
                .iter()
                .filter(|unit| unit.spec.role == Role::Workspace && !unit.removed)
                .map(|unit| unit.spec.name.as_str())
                .collect();
            let why = if known.is_empty() {
                format!(
                    "box/fork: profile `{}` has no workspace unit (no file system): there is nothing to fork",
                    live.plan.profile
                )
            } else {
                format!(
                    "box/fork: from: no workspace unit `{}` in this session; units: {}",
                    ask.from,
                    named(&known)
                )
            };
            return refuse(reply, id, why);
        };
        let parent = &live.units[parent_index];
        if let Some(why) = &parent.ended {
            return refuse(
                reply,
                id,
                format!("box/fork: unit {} ended: {why}", parent.spec.name),
            );
        }
        let parent_path = match &parent.spec.source {
            WorkspaceSource::Host(path) => path.clone(),
            WorkspaceSource::Empty => {
                return refuse(
                    reply,
                    id,
                    format!(
                        "box/fork: unit {}'s workspace is an empty directory of the engine's (workspace.source = \"empty\"), not a host directory box can fork",
                        parent.spec.name
                    ),
                );
            }
            WorkspaceSource::None => {
                return refuse(
                    reply,
                    id,
                    format!(
                        "box/fork: unit {} has no file system (workspace.source = \"none\")",
                        parent.spec.name
                    ),
                );
            }
        };
        if ask.writable && parent.spec.mode == MountMode::ReadOnly {
            return refuse(
                reply,
                id,
                format!(
                    "box/fork: writable: unit {}'s workspace is read-only (profile `{}`), so a child cannot be writable; fork with writable: false",
                    parent.spec.name, live.plan.profile
                ),
            );
        }
        // The child's spec is the parent's, or narrower: what the backend
        // can wire into the parent's kind of unit it can into the child's.
        let backend = self.services.backend.as_ref();
        let mode = match fork::effective_mode(&self.config, backend, &parent.spec, ask.mode) {
            Ok(mode) => mode,
            Err(why) => return refuse(reply, id, why),
        };
        let name = format!("fork-{}", live.next_fork);
        live.next_fork += 1;
        let session_dir = fork::session_dir(&self.config, &self.id);
        let child_path = session_dir.join(&name);
        let mut spec = match &ask.tighten {
            None => parent.spec.clone(),
            Some(_) if parent.fork.is_some() && live.workspace != Some(parent_index) => {
                return refuse(
                    reply,
                    id,
                    format!(
                        "box/fork: tighten: a fork of a fork has its parent's plan; fork the workspace unit to narrow (from: \"{}\")",
                        live.units
                            .get(live.workspace.unwrap_or(0))
                            .map_or("workspace", |unit| unit.spec.name.as_str())
                    ),
                );
            }
            Some(tighten) => match self.narrowed_workspace(live, tighten) {
                Ok(spec) => spec,
                Err(why) => return refuse(reply, id, why),
            },
        };
        spec.name = name.clone();
        spec.source = WorkspaceSource::Host(child_path.clone());
        if !ask.writable {
            spec.mode = MountMode::ReadOnly;
        }
        spec.description = match &ask.label {
            Some(label) => format!("fork of {}: {label}", ask.from),
            None => format!("fork of {}", ask.from),
        };
        let (config, services) = (self.config.clone(), self.services.clone());
        let label = live.label.clone();
        let background = self.background.clone();
        let events = live.events_tx.clone();
        let executor_params = live.executor_params.clone();
        // A child of a workspace whose credentials are hidden sees them hidden
        // too: its copy holds the same files at the same paths.
        let masks = live
            .masks
            .as_ref()
            .map(|masks| masks.wiring().to_vec())
            .unwrap_or_default();
        let session = self.id.clone();
        // Under the request's span, else the session's opening request.
        let mut span = self.services.tracer.span(
            box_otel::SpanKind::Internal,
            request_span.context().or(live.trace.parent.as_ref()),
            || format!("unit.fork {}", spec.name),
        );
        span.set("box.unit.name", spec.name.as_str());
        span.set_with("box.fork.from", || {
            live.redactor.text(&ask.from).into_owned()
        });
        self.background.spawn(async move {
            // The request's span lasts as long as the fork's work, and the
            // fork's span ends within it (locals end in reverse order) once
            // the answer went: here on a failure, when the child joins else.
            let request_span = request_span;
            let mut span = span;
            let clock = Instant::now();
            let made = {
                let (config, parent_path, child_path, ask) = (
                    config.clone(),
                    parent_path.clone(),
                    child_path.clone(),
                    ask.clone(),
                );
                tokio::task::spawn_blocking(move || {
                    fork::make_fork_dir(&config, &session_dir).and_then(|()| {
                        fork::make_fork(&config, &parent_path, &child_path, &ask, &mode, false)
                    })
                })
                .await
                .unwrap_or_else(|join| Err(format!("box/fork: the fork failed: {join}")))
            };
            let forked = match made {
                Ok(forked) => forked,
                Err(why) => {
                    span.set_error("fork_failed");
                    return reply.answer(error_response(id, code::INTERNAL_ERROR, why));
                }
            };
            span.set_with("box.fork.mode", || format!("{:?}", forked.mode_used).to_lowercase());
            let child = ChildFork {
                parent: ask.from.clone(),
                parent_path,
                path: child_path,
                base: Arc::new(std::sync::Mutex::new(forked.base.clone())),
                mode: forked.mode_used,
                shares: forked.shares.clone(),
                label: ask.label.clone(),
                holder: None,
            };
            let drop_storage = |child: ChildFork| {
                let config = config.clone();
                tokio::task::spawn_blocking(move || fork::remove_storage(&config, &child))
            };
            let objects = forked
                .objects
                .as_ref()
                .map(|objects| box_backend::ObjectsWiring {
                    host: objects.host.clone(),
                });
            // A worktree child's `.git` is a repository of box's making, not a
            // copy of the parent's: the parent's masked `.git` files do not
            // belong over it (its working files still get theirs).
            let masks: Vec<box_backend::FileMask> = if forked.mode_used == box_fork::Mechanism::Worktree {
                masks
                    .into_iter()
                    .filter(|mask| !mask.target.starts_with(".git"))
                    .collect()
            } else {
                masks
            };
            let timeout = spec.limits.start_timeout;
            let started = start_units(
                &config,
                &services,
                &label,
                std::slice::from_ref(&spec),
                timeout,
                &background,
                StartWiring {
                    workspace_masks: &masks,
                    objects: objects.as_ref(),
                    parent: Some(&ask.from),
                    trace: span.context(),
                    ..StartWiring::default()
                },
            )
            .await;
            let (key, unit, egress) = match started {
                Ok((mut started, egress)) if started.len() == 1 => match started.pop() {
                    Some((key, unit)) => (key, unit, egress),
                    None => return,
                },
                Ok(_) => return,
                Err(error) => {
                    let _ = drop_storage(child).await;
                    return reply.answer(error_response(
                        id,
                        code::INTERNAL_ERROR,
                        format!("box/fork: starting unit {name}: {error}"),
                    ));
                }
            };
            let mut link = ExecutorLink::new(unit.io.stdin, unit.io.stdout);
            let remaining = timeout.saturating_sub(clock.elapsed());
            let initialized = initialize_executor(
                &mut link,
                executor_params,
                config.executor_init_timeout.min(remaining),
            )
            .await;
            let tracked = Tracked {
                key,
                id: unit.envelope.id.clone(),
            };
            let tools = match initialized {
                Ok(start) => start.tools,
                Err(why) => {
                    drop(link);
                    remove_until_gone(&services, vec![tracked]).await;
                    let _ = drop_storage(child).await;
                    return reply.answer(error_response(
                        id,
                        code::INTERNAL_ERROR,
                        format!("box/fork: starting unit {name}: {why}"),
                    ));
                }
            };
            let mut envelope = unit.envelope;
            envelope.parent = Some(ask.from.clone());
            let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            envelope.limits.set_start_timeout_ms(millis);
            tracing::info!(%session, unit = %name, from = %ask.from, mode = fork::mode_name(forked.mode_used), took_ms = clock.elapsed().as_millis() as u64, "forked a workspace unit");
            // A fork of the workspace unit, or of another child.
            let parent_kind = if ask.from == "workspace" {
                "workspace"
            } else {
                "fork"
            };
            services.metrics.fork_started(clock.elapsed(), parent_kind);
            let started = ForkStarted {
                id,
                reply,
                key,
                spec,
                envelope,
                link,
                ended: unit.ended,
                renewal: unit.renewal,
                tools,
                egress,
                child,
                advisory: forked.advisory.clone(),
                skipped: forked.skipped.len(),
                spans: vec![span, request_span],
            };
            if let Err(sent) = events.send(UnitEvent::Forked(Box::new(started))).await
                && let UnitEvent::Forked(started) = sent.0
            {
                // The session ended meanwhile: the child goes with it.
                let started = *started;
                started.reply.answer(error_response(
                    started.id,
                    code::INTERNAL_ERROR,
                    "box/fork: the session ended before the child joined it",
                ));
                drop(started.link);
                remove_until_gone(&services, vec![tracked]).await;
                let _ = drop_storage(started.child).await;
            }
        });
    }

    /// The workspace unit's spec under the session's tightening and then
    /// `tighten`: narrower than the session's, never wider (a wider ask is
    /// refused naming the field).
    fn narrowed_workspace(&self, live: &Live, tighten: &Value) -> Result<UnitSpec, String> {
        let session = box_policy::plan::Tightening::parse(&live.tighten)
            .and_then(|tightening| box_policy::plan::tighten(&live.profile, &tightening))
            .map_err(|error| format!("box/fork: the session's tightening: {error}"))?;
        let plan = (self.config.resolve)(&session, tighten, &self.config.facts)
            .map_err(|error| format!("box/fork: {error}"))?;
        plan.units
            .into_iter()
            .find(|unit| unit.role == Role::Workspace)
            .ok_or_else(|| "box/fork: tighten left no workspace unit".to_owned())
    }

    /// A started child joins the session: routed, linked, answered.
    pub(super) fn join_fork(&self, live: &mut Live, started: ForkStarted) {
        let index = live.router.add_unit(FIRST_REQUEST_ID);
        if index != live.units.len() {
            // The router and the units grow together; never expected.
            tracing::error!(session = %self.id, "the router's units and the session's disagree");
        }
        let writer = link_unit(
            index,
            started.link,
            started.ended,
            &live.events_tx,
            &mut live.tasks,
        );
        let name = started.spec.name.clone();
        let mut result = json!({
            "unit": name,
            "from": started.child.parent,
            "mode": fork::mode_name(started.child.mode),
            "shares": started.child.shares,
            "envelope": serde_json::to_value(&started.envelope).unwrap_or(Value::Null),
        });
        if let Some(advisory) = &started.advisory {
            result["advisory"] = json!(advisory);
        }
        if started.skipped > 0 {
            result["skipped"] = json!(started.skipped);
        }
        live.redactor.message(&mut result);
        live.units.push(Unit {
            key: started.key,
            spec: started.spec,
            envelope: started.envelope,
            writer: Some(writer),
            ended: None,
            closed: false,
            close_reason: None,
            draining: None,
            tools: started.tools,
            _renewal: started.renewal,
            fork: Some(started.child),
            removed: false,
        });
        if let Some(child) = live.units.last() {
            self.watch_limits(std::slice::from_ref(child), &started.egress);
        }
        live.egress.extend(started.egress);
        started.reply.answer(result_response(started.id, result));
        // The fork's span, then the request's, end after the answer.
        drop(started.spans);
    }

    /// `box/merge {unit, theirs?}`: the child's changes into its parent, all
    /// or nothing, off the session task (merges into one parent wait for
    /// each other host-wide).
    pub(super) fn merge(&self, live: &mut Live, request: Request) {
        let Request {
            id,
            message,
            reply,
            span: mut request_span,
            ..
        } = request;
        let message = &message;
        let asked = fork::unit_param("box/merge", message, &["unit", "theirs"])
            .and_then(|unit| fork::theirs(message).map(|theirs| (unit, theirs)));
        let (unit, theirs) = match asked {
            Ok(asked) => asked,
            Err(why) => {
                request_span.set_error(&code::INVALID_PARAMS.to_string());
                return reply.answer(error_response(id, code::INVALID_PARAMS, why));
            }
        };
        let child = match self.child_of(live, "box/merge", &unit) {
            Ok(index) => live.units[index].fork.clone(),
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        let Some(child) = child else { return };
        let config = self.config.clone();
        let mut span = self.services.tracer.span(
            box_otel::SpanKind::Internal,
            request_span.context().or(live.trace.parent.as_ref()),
            || "unit.merge".to_owned(),
        );
        span.set_with("box.unit.name", || live.redactor.text(&unit).into_owned());
        // The merge runs off the session task, with its own handle.
        let counted = self.services.clone();
        self.background.spawn(async move {
            // The merge's span ends before the request's, both after the
            // answer (locals end in reverse order).
            let mut request_span = request_span;
            let mut span = span;
            let merged =
                tokio::task::spawn_blocking(move || fork::merge(&config, &unit, &child, theirs))
                    .await
                    .unwrap_or_else(|join| {
                        Err((
                            code::INTERNAL_ERROR,
                            format!("box/merge: the merge failed: {join}"),
                            Value::Null,
                        ))
                    });
            match merged {
                Ok(result) => {
                    counted.metrics.merge("merged");
                    reply.answer(result_response(id, result));
                }
                Err((code, message, data)) => {
                    span.set_error(&code.to_string());
                    request_span.set_error(&code.to_string());
                    counted.metrics.merge(if code == code::INTERNAL_ERROR {
                        "failed"
                    } else {
                        "refused"
                    });
                    reply.answer(error_response_with_data(id, code, message, data));
                }
            }
        });
    }

    /// `box/discard {unit}`: the child leaves the session at once (its calls
    /// in flight are answered), then its unit and storage are removed; the
    /// answer comes once both are gone.
    pub(super) fn discard(&self, live: &mut Live, request: Request) {
        let Request {
            id, message, reply, ..
        } = request;
        let message = &message;
        let unit = match fork::unit_param("box/discard", message, &["unit"]) {
            Ok(unit) => unit,
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        let index = match self.child_of(live, "box/discard", &unit) {
            Ok(index) => index,
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        if live.workspace == Some(index) {
            return reply.answer(error_response(
                id,
                code::INVALID_PARAMS,
                "box/discard: the session's workspace unit stays while the session lasts; end the session to remove it and its fork".to_owned(),
            ));
        }
        let children: Vec<&str> = live
            .units
            .iter()
            .filter(|other| {
                !other.removed && other.fork.as_ref().is_some_and(|fork| fork.parent == unit)
            })
            .map(|other| other.spec.name.as_str())
            .collect();
        if !children.is_empty() {
            return reply.answer(error_response(
                id,
                code::INVALID_PARAMS,
                format!(
                    "box/discard: unit {unit} has forks of its own, {}; discard them first",
                    named(&children)
                ),
            ));
        }
        for mut forward in live.router.remove_unit(index) {
            self.record(live, index, &mut forward.tag, "unit_ended");
            let mut response = error_response(
                forward.client_id,
                code::INTERNAL_ERROR,
                format!("unit {unit} was discarded"),
            );
            // A task's call fails its task.
            if let Some(call) = forward.tag.unit_id
                && tasks::finish(live, index, call, &mut response)
            {
                continue;
            }
            forward.reply.answer(response);
        }
        let state = &mut live.units[index];
        self.services
            .metrics
            .fork_discarded(state.envelope.state == UnitState::Ended);
        state.removed = true;
        // Not wanted any more: its lease is no longer renewed.
        state._renewal = None;
        state
            .ended
            .get_or_insert_with(|| "it was discarded".to_owned());
        state.writer = None;
        state.envelope.state = UnitState::Ended;
        let tracked = Tracked {
            key: state.key,
            id: state.envelope.id.clone(),
        };
        let child = state.fork.clone();
        live.egress.retain(|proxy| proxy.unit != unit);
        let (config, services) = (self.config.clone(), self.services.clone());
        self.background.spawn(async move {
            remove_until_gone(&services, vec![tracked]).await;
            if let Some(child) = child {
                let config = config.clone();
                let _ = tokio::task::spawn_blocking(move || fork::remove_storage(&config, &child))
                    .await;
            }
            reply.answer(result_response(
                id,
                json!({"unit": unit, "discarded": true}),
            ));
        });
    }

    /// The index of the fork named `unit`, or why there is none.
    fn child_of(&self, live: &Live, method: &str, unit: &str) -> Result<usize, String> {
        let forks: Vec<&str> = live
            .units
            .iter()
            .filter(|candidate| candidate.fork.is_some() && !candidate.removed)
            .map(|candidate| candidate.spec.name.as_str())
            .collect();
        match live
            .units
            .iter()
            .position(|candidate| candidate.spec.name == unit)
        {
            Some(index) if live.units[index].removed => {
                Err(format!("{method}: unit {unit} was discarded"))
            }
            Some(index) if live.units[index].fork.is_some() => Ok(index),
            Some(index) if live.workspace == Some(index) => Err(format!(
                "{method}: the workspace unit is not a fork (profile `{}` has workspace.source other than \"fork\"); forks: {}",
                live.plan.profile,
                named(&forks)
            )),
            Some(_) => Err(format!(
                "{method}: unit {unit} is not a fork of this session; forks: {}",
                named(&forks)
            )),
            None => Err(format!(
                "{method}: no unit {unit} in this session; forks: {}",
                named(&forks)
            )),
        }
    }
}
