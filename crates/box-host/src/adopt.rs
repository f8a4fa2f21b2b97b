//! Re-adopting a dead host's kept sessions at this host's start: each
//! record of the state directory (`state.rs`) resolved again, its units
//! re-adopted by the backend and its egress proxies served again, then
//! waiting in `Services::reattachable` for its client.

use std::sync::Arc;

use box_backend::StartedUnit;
use box_policy::plan::Plan;
use serde_json::Value;

use crate::state::{
    Adopted, Reattached, SessionRecord, hold_instance, leave_to_lease, plan_digest,
};

/// How long a host keeps renewing the leases of a re-adopted session its
/// client has not reattached to; then the units are left to their leases.
pub const REATTACH_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// How long a re-adopted unit's init gets to reconnect (it retries every
/// 250 ms to 1 s while its lease runs).
const RECONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// At a host's start: for every trusted record in its state directory,
/// resolve the plan again and re-adopt the units (concurrently, sessions
/// and units alike, in a task of its own, so the host serves meanwhile),
/// each session then waiting in [`crate::Services::reattachable`] for its
/// client; a reattach that comes first waits for its session's adoption.
/// Returns the backend ids of every persisted unit, which the start-up sweep
/// must leave alone (they are either re-adopted or left to their lease).
pub fn adopt_all(
    config: &Arc<crate::HostConfig>,
    services: &Arc<crate::Services>,
) -> std::collections::HashSet<String> {
    let Some(store) = &services.state else {
        return Default::default();
    };
    let records = store.load();
    let ids = records
        .iter()
        .flat_map(|record| record.units.iter().map(|unit| unit.id.clone()))
        .collect();
    for record in &records {
        services.reattachable.adopting(&record.session);
    }
    let (config, services) = (config.clone(), services.clone());
    tokio::spawn(async move {
        let clock = std::time::Instant::now();
        let count = records.len();
        futures::future::join_all(records.into_iter().map(|record| {
            let (config, services) = (&config, &services);
            async move {
                let session = record.session.clone();
                match adopt(config, services, record).await {
                    Some(adopted) => {
                        match &adopted.units {
                            Ok(reattached) => tracing::info!(%session, units = reattached.units.len(), "re-adopted a persisted session's units; waiting for its client to reattach"),
                            Err(why) => tracing::warn!(%session, %why, "a persisted session cannot be reattached; its units are left to their leases"),
                        }
                        services.reattachable.insert(adopted);
                    }
                    None => services.reattachable.settle(&session),
                }
            }
        }))
        .await;
        if count > 0 {
            let elapsed_ms = u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::info!(sessions = count, elapsed_ms, "persisted sessions settled");
        }
        // A session nobody comes back for does not keep its units forever.
        tokio::time::sleep(REATTACH_WINDOW).await;
        for adopted in services.reattachable.take_all() {
            if let Ok(reattached) = adopted.units {
                leave_to_lease(reattached.units);
            }
            tracing::warn!(session = %adopted.record.session, "no client reattached within {}; its units are left to their leases", humantime::format_duration(REATTACH_WINDOW));
            if let Some(store) = &services.state {
                store.remove(&adopted.record.session);
            }
        }
    });
    ids
}

async fn adopt(
    config: &crate::HostConfig,
    services: &crate::Services,
    record: SessionRecord,
) -> Option<Adopted> {
    // Units of another (dead) instance keep its label: holding it keeps
    // every sweep and `box gc` from taking them for a dead host's leftovers
    // once the old host's lease bound has passed.
    let held = if record.instance == config.instance {
        None
    } else {
        match hold_instance(&services.held_instances, &record.instance) {
            Some(lock) => Some(lock),
            None => {
                tracing::debug!(session = %record.session, instance = %record.instance, "a persisted session's host is not known dead; leaving it");
                return None;
            }
        }
    };
    let units =
        match config.catalog.load(&record.profile) {
            Err(error) => Err(format!(
                "profile `{}` no longer loads: {error}",
                record.profile
            )),
            Ok(profile) => match (config.resolve)(&profile, &record.tighten, &config.facts) {
                Err(error) => Err(format!(
                    "profile `{}` with the session's tightening no longer resolves: {error}",
                    record.profile
                )),
                Ok(plan) => adopt_units(config, services, &record, &plan).await.map(
                    |(mut units, egress)| {
                        if let Some(held) = &held {
                            for unit in &mut units {
                                unit.renewal = unit
                                    .renewal
                                    .take()
                                    .map(|renewal| renewal.holding(Arc::clone(held)));
                            }
                        }
                        Reattached {
                            plan,
                            profile,
                            units,
                            egress,
                        }
                    },
                ),
            },
        };
    Some(Adopted { record, units })
}

async fn adopt_units(
    config: &crate::HostConfig,
    services: &crate::Services,
    record: &SessionRecord,
    plan: &Plan,
) -> Result<(Vec<StartedUnit>, Vec<crate::egress::EgressProxy>), String> {
    let digest = plan_digest(plan);
    if digest != record.plan_digest {
        return Err(format!(
            "profile `{}` resolves to another plan than the session started with (plan digest {} then, {} now): the profile or the host's facts changed",
            record.profile, record.plan_digest, digest
        ));
    }
    // Before anything is adopted: a unit whose workspace is gone is not
    // worth keeping alive.
    for spec in &plan.units {
        if let box_policy::plan::WorkspaceSource::Host(path) = &spec.source
            && !path.is_dir()
        {
            return Err(format!(
                "unit {}: its workspace {} is gone",
                spec.name,
                path.display()
            ));
        }
    }
    if plan.workspace_fork.is_some() {
        return Err(
            "a session on a forked workspace (source = \"fork\") cannot be reattached yet"
                .to_owned(),
        );
    }
    if plan.units.len() != record.units.len() {
        return Err(format!(
            "the plan has {} unit(s), the session persisted {}",
            plan.units.len(),
            record.units.len()
        ));
    }
    let label = box_backend::SessionLabel {
        instance: config.instance.clone(),
        session: record.session.clone(),
        profile: plan.profile.clone(),
    };
    // Each egress unit's proxy is served again, in the directory the unit has
    // mounted, before its unit is adopted: the unit's bridge connects per
    // connection and finds this host's proxy from now on.
    let mut egress = Vec::new();
    for (spec, unit) in plan.units.iter().zip(&record.units) {
        if spec.network.mode != box_policy::plan::NetworkMode::Egress {
            continue;
        }
        let Some(dir) = &unit.egress_dir else {
            return Err(format!(
                "unit {}: its egress socket directory was not persisted (the session was kept by an older host), so its proxy cannot be served where the unit looks for it",
                spec.name
            ));
        };
        egress.push(crate::egress::EgressProxy::adopt(
            services.proxies(),
            &record.session,
            spec,
            dir,
        )?);
    }
    let kind = services.backend.kind();
    if !services.backend.capabilities().adopt {
        return Err(format!(
            "the {kind} backend cannot re-adopt a unit another host process started"
        ));
    }
    let mut asks = Vec::new();
    for (spec, unit) in plan.units.iter().zip(&record.units) {
        if unit.name != spec.name || unit.backend != kind.as_str() {
            return Err(format!(
                "unit {} on the {} backend was persisted, the plan and this host have unit {} on the {} backend",
                unit.name,
                unit.backend,
                spec.name,
                kind.as_str()
            ));
        }
        let names = |key: &str| -> Vec<String> {
            unit.envelope
                .get(key)
                .and_then(Value::as_array)
                .map(|names| {
                    names
                        .iter()
                        .filter_map(|name| name.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        asks.push(box_backend::AdoptUnit {
            id: unit.id.clone(),
            identity: unit.identity.clone(),
            run_dir: unit.run_dir.clone(),
            image_id: Some(unit.image_id.clone()).filter(|id| !id.is_empty()),
            image_digest: unit.image_digest.clone(),
            env_passed: names("envPassed"),
            env_scrubbed: names("envScrubbed"),
            timeout: RECONNECT_WAIT,
        });
    }
    let results = futures::future::join_all(
        plan.units
            .iter()
            .zip(&asks)
            .map(|(spec, ask)| services.backend.adopt(&label, spec, ask)),
    )
    .await;
    let mut units = Vec::new();
    let mut lost = Vec::new();
    for result in results {
        match result {
            Ok(unit) => units.push(unit),
            Err(error) => lost.push(error.to_string()),
        }
    }
    if !lost.is_empty() {
        // The others are not kept alive for a session that cannot be served.
        leave_to_lease(units);
        return Err(format!("lost: {}", lost.join("; ")));
    }
    Ok((units, egress))
}
