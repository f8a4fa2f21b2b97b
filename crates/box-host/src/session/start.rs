//! A fresh session, the way in of an `initialize` without a reattach: the
//! profile resolved and tightened into a plan, the workspace scanned for
//! persisted credentials (refused, reported or hidden as the profile says),
//! every unit started (all or nothing, within the profile's
//! `start_timeout`) and its executor initialized, and the session's
//! identity kept for a later reattach (`--state`).

use std::time::{Duration, Instant};

use box_backend::{Envelope, SessionLabel};
use box_jsonrpc::code;
use box_policy::plan::{Plan, PlanError, Role, WorkspaceSource};
use box_policy::profile::{OnPersisted, Profile};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::Session;
use super::forks::ForkGuard;
use super::handshake::{StartError, set_box_field};
use super::live::{EVENT_QUEUE, Live, Unit, link_unit};
use crate::ask::{Ask, executor_initialize_params, initialize_result};
use crate::egress::EgressProxy;
use crate::fork;
use crate::ledger::Tracked;
use crate::redact::{self, SessionRedactor};
use crate::router::Router;
use crate::state;
use crate::units::{
    ExecutorLink, ExecutorStart, FIRST_REQUEST_ID, InitProgress, StartWiring, initialize_executor,
    remove_until_gone, start_units,
};

impl Session {
    /// The session's redactor, knowing the plan's secrets, the host's
    /// credentials and `persisted` (the workspace's persisted credentials),
    /// and the label its units carry: what a fresh start and a reattach both
    /// build before a unit speaks.
    pub(super) fn redactor_and_label(
        &self,
        plan: &Plan,
        persisted: Vec<redact::Secret>,
    ) -> Result<(SessionRedactor, SessionLabel), StartError> {
        let mut secrets = redact::session_secrets(plan, &(self.config.environment)());
        secrets.extend(persisted);
        let redactor =
            SessionRedactor::new(&self.id, secrets, self.services.redact_scratch.clone()).map_err(
                |why| StartError::internal(format!("building the session's redactor: {why}")),
            )?;
        let label = SessionLabel {
            instance: self.config.instance.clone(),
            session: self.id.clone(),
            profile: plan.profile.clone(),
        };
        Ok((redactor, label))
    }

    /// The profile `ask` names, loaded, and the plan it resolves to, tightened.
    pub(super) fn plan_for(&self, ask: &Ask) -> Result<(Profile, Plan), StartError> {
        let profile_name = ask
            .profile
            .clone()
            .unwrap_or_else(|| self.config.default_profile.clone());
        let profile = self.config.catalog.load(&profile_name).map_err(|error| {
            StartError::refused(
                "profile",
                format!("box.profile: profile `{profile_name}`: {error}"),
            )
        })?;
        let plan =
            (self.config.resolve)(&profile, &ask.tighten, &self.config.facts).map_err(|error| {
                let (data, reason) = match &error {
                    PlanError::Widening { field, .. } => {
                        (json!({"field": format!("tighten.{field}")}), "widening")
                    }
                    PlanError::Invalid(_) => (json!({"field": "tighten"}), "tightening"),
                    PlanError::DangerousWorkspace { .. } => {
                        (json!({"field": "workspace.source"}), "workspace")
                    }
                };
                StartError {
                    code: code::INVALID_PARAMS,
                    message: error.to_string(),
                    data: Some(data),
                    refusal: Some(reason),
                }
            })?;
        Ok((profile, plan))
    }

    /// A fresh session: resolve its plan, start its units (all or nothing)
    /// and initialize their executors; the initialize result for the client.
    pub(super) async fn start(
        &self,
        client_params: Option<&Map<String, Value>>,
        ask: &Ask,
        version: &'static str,
        events: &mpsc::Sender<Value>,
        trace: Option<&box_otel::SpanContext>,
    ) -> Result<(Live, Value), StartError> {
        let (profile, mut plan) = self.plan_for(ask)?;
        // Keyed before a fork rewrites the workspace's source.
        let listed_for = plan.clone();
        // Before any unit starts: nothing in the workspace runs yet, so
        // nothing rewrites what the scan reads.
        let persisted = match plan
            .units
            .iter()
            .find(|unit| unit.role == Role::Workspace)
            .map(|unit| &unit.source)
        {
            Some(WorkspaceSource::Host(path)) => {
                let (session, path) = (self.id.clone(), path.clone());
                tokio::task::spawn_blocking(move || redact::scan_persisted(&session, &path))
                    .await
                    .unwrap_or_default()
            }
            _ => redact::Persisted::default(),
        };
        if plan.on_persisted_credentials == OnPersisted::Refuse
            && let Some(first) = persisted.reported.first()
        {
            let found: Vec<String> = persisted
                .reported
                .iter()
                .map(|found| {
                    format!(
                        "{}:{} {} ({})",
                        found.file, found.line, found.key, found.kind
                    )
                })
                .collect();
            return Err(StartError {
                code: code::INVALID_PARAMS,
                message: format!(
                    "the workspace holds {} persisted credential(s), first {}:{} {}, and profile `{}` has on_persisted_credentials = \"refuse\"; remove them from the workspace (or set \"report\"): {}",
                    found.len(),
                    first.file,
                    first.line,
                    first.key,
                    plan.profile,
                    found.join("; ")
                ),
                data: Some(json!({
                    "field": "workspace.on_persisted_credentials",
                    "persistedCredentials": persisted.reported,
                })),
                refusal: Some("persisted_credentials"),
            });
        }
        // `hide`: the workspace unit sees each such file masked, read-only.
        let masks = match (&plan.on_persisted_credentials, persisted.files.is_empty()) {
            (OnPersisted::Hide, false) => {
                let workspace = plan
                    .units
                    .iter()
                    .find_map(|unit| match (&unit.role, &unit.source) {
                        (Role::Workspace, WorkspaceSource::Host(path)) => Some(path.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                let (runtime_dir, files) =
                    (self.config.runtime_dir.clone(), persisted.files.clone());
                let made = tokio::task::spawn_blocking(move || {
                    crate::hide::Masks::make(&runtime_dir, &workspace, &files)
                })
                .await
                .map_err(|why| StartError::internal(format!("masking persisted credentials: {why}")))?
                .map_err(|why| StartError {
                    code: code::INVALID_PARAMS,
                    message: format!(
                        "profile `{}` has on_persisted_credentials = \"hide\" and the workspace's credentials could not be masked: {why}; remove them from the workspace (or set \"report\")",
                        plan.profile
                    ),
                    data: Some(json!({"field": "workspace.on_persisted_credentials"})),
                    refusal: Some("persisted_credentials"),
                })?;
                Some(made)
            }
            _ => None,
        };
        // Built before any unit starts: a unit's first word is already redacted.
        let (redactor, label) = self.redactor_and_label(&plan, persisted.secrets)?;
        let start_clock = Instant::now();
        // The session's (every unit has the same): engine start and executor initialize.
        let start_timeout = plan
            .units
            .iter()
            .map(|unit| unit.limits.start_timeout)
            .max()
            .unwrap_or(Duration::from_secs(60));
        let start_deadline = tokio::time::Instant::now() + start_timeout;
        // A client that sent a progress token hears how a slow start (an
        // image pull) goes, as MCP progress on its initialize.
        let progress = client_params
            .and_then(|params| params.get("_meta"))
            .and_then(|meta| meta.get("progressToken"))
            .filter(|token| token.is_string() || token.is_number())
            .map(|token| InitProgress::new(token.clone(), events.clone()));
        // `source = "fork"`: the workspace unit starts on the session's own
        // fork of the host directory; the guard removes it if the start fails.
        let mut workspace_fork = ForkGuard {
            config: self.config.clone(),
            child: None,
            background: self.background.clone(),
        };
        let mut objects = None;
        let mut fork_claim = None;
        if let Some(mode) = plan.workspace_fork {
            let forked = self
                .fork_workspace(&mut plan, mode, &label, masks.is_some())
                .await?;
            workspace_fork.child = Some(forked.child);
            objects = forked.objects;
            fork_claim = forked.claim;
        }
        // On a worktree fork (`source = "fork"`), `.git` is box's new repository,
        // not the parent's: only the working files' masks apply.
        let workspace_masks: Vec<box_backend::FileMask> = masks
            .as_ref()
            .map(|masks| {
                masks
                    .wiring()
                    .iter()
                    .filter(|mask| objects.is_none() || !mask.target.starts_with(".git"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let started = start_units(
            &self.config,
            &self.services,
            &label,
            &plan.units,
            start_timeout,
            &self.background,
            StartWiring {
                workspace_masks: &workspace_masks,
                objects: objects.as_ref(),
                progress: progress.as_ref(),
                parent: None,
                trace,
                fork_claim: fork_claim.as_ref(),
            },
        )
        .await;
        // A unit taken for the fork that no start bound (one refused first).
        if let Some(crate::pool::ForkClaim::Taken(taken)) = &fork_claim
            && let Some(left) = taken.left()
        {
            let services = self.services.clone();
            self.background
                .spawn(async move { remove_until_gone(&services, vec![left]).await });
        }
        let (started, egress) = started.map_err(|error| {
            StartError::internal(format!("starting the session's units: {error}"))
        })?;

        let executor_params = executor_initialize_params(client_params, ask, version);
        // What is left of the start deadline bounds the executors' initialize too.
        let timeout = self
            .config
            .executor_init_timeout
            .min(start_deadline.saturating_duration_since(tokio::time::Instant::now()));
        let mut links = Vec::new();
        let mut ends = Vec::new();
        let mut renewals = Vec::new();
        let mut envelopes = Vec::new();
        let mut tracked = Vec::new();
        for (key, unit) in started {
            tracked.push(Tracked {
                key,
                id: unit.envelope.id.clone(),
            });
            let mut envelope = unit.envelope;
            if envelope.role == Role::Workspace {
                envelope.persisted_credentials = persisted.reported.clone();
                // The backend mounted every mask or refused to start the unit.
                if masks.is_some() {
                    for found in &mut envelope.persisted_credentials {
                        found.hidden = true;
                    }
                }
            }
            // Enforced by the host, so it is applied: said in plain numbers.
            let millis = u64::try_from(start_timeout.as_millis()).unwrap_or(u64::MAX);
            envelope.limits.set_start_timeout_ms(millis);
            envelopes.push(envelope);
            links.push(ExecutorLink::new(unit.io.stdin, unit.io.stdout));
            ends.push(unit.ended);
            renewals.push(unit.renewal);
        }
        let tracer = &self.services.tracer;
        let results =
            futures::future::join_all(links.iter_mut().zip(&plan.units).map(|(link, spec)| {
                let mut span = tracer.span(box_otel::SpanKind::Internal, trace, || {
                    format!("unit.initialize {}", spec.name)
                });
                span.set("box.unit.name", spec.name.as_str());
                let initialized = initialize_executor(link, executor_params.clone(), timeout);
                async move {
                    let result = initialized.await;
                    if result.is_err() {
                        span.set_error("initialize_failed");
                    }
                    result
                }
            }))
            .await;
        let mut initialized = Vec::new();
        for (spec, result) in plan.units.iter().zip(results) {
            match result {
                Ok(result) => initialized.push(result),
                Err(why) => {
                    drop(links);
                    drop(ends);
                    drop(renewals);
                    let services = self.services.clone();
                    self.background
                        .spawn(async move { remove_until_gone(&services, tracked).await });
                    return Err(StartError::internal(format!(
                        "starting the session's units: unit {}: {why}",
                        spec.name
                    )));
                }
            }
        }
        let ids: Vec<String> = tracked.iter().map(|unit| unit.id.clone()).collect();
        if let Some(tools) = plan
            .units
            .iter()
            .position(|unit| unit.role == Role::Workspace)
            .and_then(|index| initialized[index].tools.as_ref())
        {
            self.services
                .tool_lists
                .keep(&listed_for, ask.max_read_bytes, tools);
        }

        // Counted once the session is up: a failed start leaves no session behind.
        self.services
            .metrics
            .unit_start(start_clock.elapsed(), ids.len());
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let mut tasks = JoinSet::new();
        let mut units = Vec::new();
        for (index, ((((link, ended), (spec, envelope)), tracked), renewal)) in links
            .into_iter()
            .zip(ends)
            .zip(plan.units.iter().cloned().zip(envelopes))
            .zip(tracked)
            .zip(renewals)
            .enumerate()
        {
            let writer = link_unit(index, link, ended, &events_tx, &mut tasks);
            units.push(Unit {
                key: tracked.key,
                spec,
                envelope,
                writer: Some(writer),
                ended: None,
                closed: false,
                close_reason: None,
                draining: None,
                tools: initialized[index].tools.clone(),
                _renewal: renewal,
                fork: None,
                removed: false,
            });
        }
        if let Some(child) = workspace_fork.child.take()
            && let Some(unit) = units
                .iter_mut()
                .find(|unit| unit.spec.role == Role::Workspace)
        {
            unit.fork = Some(child);
        }
        let workspace = units
            .iter()
            .position(|unit| unit.spec.role == Role::Workspace);
        let envelopes: Vec<&Envelope> = units.iter().map(|unit| &unit.envelope).collect();
        let mut result = initialize_result(&plan, &envelopes, workspace, &initialized, version);
        // A workspace on its own fork (`source = "fork"`) says so as `box/fork`
        // answers: where from, how, and what it shares with the directory.
        if let Some(fork) = workspace.and_then(|index| units[index].fork.as_ref()) {
            set_box_field(
                &mut result,
                "fork",
                json!({
                    "from": fork.parent,
                    "mode": fork::mode_name(fork.mode),
                    "shares": fork.shares,
                }),
            );
        }
        redactor.message(&mut result);
        let kept = self.persist(
            &plan,
            ask,
            version,
            &units,
            &initialized,
            &egress,
            &mut result,
        );
        let journal = kept
            .then(|| self.services.state.as_ref()?.journal(&self.id))
            .flatten();
        let _ = self.version.set(version);
        tracing::info!(
            session = %self.id,
            profile = %plan.profile,
            units = units.len(),
            backend = %self.services.backend.kind(),
            "session started"
        );
        self.watch_limits(&units, &egress);
        let count = units.len();
        Ok((
            Live {
                plan,
                units,
                workspace,
                router: Router::new(count, FIRST_REQUEST_ID),
                events_tx,
                events_rx,
                tasks,
                last_activity: Instant::now(),
                started: Instant::now(),
                redactor,
                egress,
                executor_params,
                label,
                next_fork: 1,
                profile,
                tighten: ask.tighten.clone(),
                masks,
                journal,
                late: Default::default(),
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

    /// Keep the session's identity in the state directory (`--state`) and
    /// give the client its reattach secret in `result` (`box.session`). A
    /// session whose identity cannot be kept runs on without one (logged).
    #[expect(
        clippy::too_many_arguments,
        reason = "each is one part of what a session keeps; bundling them would only rename them"
    )]
    fn persist(
        &self,
        plan: &Plan,
        ask: &Ask,
        version: &str,
        units: &[Unit],
        initialized: &[ExecutorStart],
        egress: &[EgressProxy],
        result: &mut Value,
    ) -> bool {
        let Some(store) = &self.services.state else {
            return false;
        };
        // A backend that cannot re-adopt its units gets no identity to
        // reattach with: a later host could only refuse it.
        if !self.services.backend.capabilities().adopt {
            return false;
        }
        let (secret, secret_sha256) = state::new_secret();
        let kind = self.services.backend.kind();
        let record = state::SessionRecord {
            version: state::VERSION,
            session: self.id.clone(),
            instance: self.config.instance.clone(),
            secret_sha256,
            profile: plan.profile.clone(),
            tighten: ask.tighten.clone(),
            plan_digest: state::plan_digest(plan),
            protocol_version: version.to_owned(),
            started_unix_ms: state::unix_ms(),
            initialize: result.clone(),
            units: units
                .iter()
                .zip(initialized)
                .map(|(unit, initialized)| state::UnitRecord {
                    name: unit.spec.name.clone(),
                    backend: kind.as_str().to_owned(),
                    id: unit.envelope.id.clone(),
                    identity: format!(
                        "{}/{}/{}",
                        self.config.instance,
                        // A warm unit's init proves the identity its pool started it with.
                        unit.envelope
                            .warm
                            .as_ref()
                            .and_then(|warm| warm.pool_session.as_deref())
                            .unwrap_or(&self.id),
                        unit.spec.name
                    ),
                    image_id: unit.envelope.image_id.clone(),
                    image_digest: unit.envelope.image_digest.clone(),
                    // Its backend's, from the renewal, below.
                    run_dir: std::path::PathBuf::new(),
                    envelope: serde_json::to_value(&unit.envelope).unwrap_or(Value::Null),
                    tools: initialized.tools.clone(),
                    // The directory its unit has mounted: a later host serves
                    // the proxy there again.
                    egress_dir: egress
                        .iter()
                        .find(|proxy| proxy.unit == unit.spec.name)
                        .map(|proxy| proxy.dir().to_owned()),
                })
                .collect(),
        };
        // Each unit's run directory, as its backend reported it.
        let mut record = record;
        for (unit, persisted) in units.iter().zip(record.units.iter_mut()) {
            match unit._renewal.as_ref().and_then(|renewal| renewal.run_dir()) {
                Some(dir) => persisted.run_dir = dir.to_owned(),
                None => {
                    tracing::debug!(session = %self.id, unit = %unit.spec.name, "a unit without a run directory cannot be reattached; keeping no identity");
                    return false;
                }
            }
        }
        match store.write(&record) {
            Ok(()) => {
                set_box_field(result, "session", json!({"id": self.id, "secret": secret}));
                true
            }
            Err(why) => {
                tracing::warn!(session = %self.id, %why, "the session's identity is not kept; it cannot be reattached after a restart");
                false
            }
        }
    }
}
