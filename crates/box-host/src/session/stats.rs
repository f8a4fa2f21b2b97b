//! `box/units.stats {unit?}`: what each of the session's running units uses
//! now (CPU time, memory now and at peak, tasks, block IO, OOM kills), as
//! its backend reads it from the unit's cgroup (a local unit: its
//! processes); what its `/tmp` and home hold (`tmpBytes`, `homeBytes`); and
//! what its egress carried (`egressBytesUp`, `egressBytesDown`,
//! `egressConnections`, counted as each connection ends). A figure the
//! backend cannot read is `null`; a unit whose backend reports none has
//! `error` saying why.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use box_jsonrpc::{code, params, result_response};
use serde_json::{Value, json};

use super::Session;
use super::live::Live;
use super::methods::Request;
use crate::egress::EgressUsage;

/// A running unit asked about: its name, backend id, where its `/tmp` and
/// home are, and its egress counters.
struct Asked {
    unit: String,
    id: String,
    home: Option<PathBuf>,
    egress: Option<Arc<EgressUsage>>,
}

impl Session {
    /// The method's handler: the units named, then read off the session's task.
    pub(super) fn units_stats(&self, live: &mut Live, request: Request) {
        let units = match chosen(live, &request.message) {
            Ok(units) => units,
            Err(error) => return request.answer(live, Err(error)),
        };
        let backend = self.services.backend.clone();
        let Request { id, reply, .. } = request;
        self.background.spawn(async move {
            let mut entries = Vec::with_capacity(units.len());
            for asked in units {
                let Asked {
                    unit,
                    id: unit_id,
                    home,
                    egress,
                } = asked;
                let mut entry = json!({"unit": unit, "id": unit_id});
                let mut paths = vec![PathBuf::from("/tmp")];
                paths.extend(home);
                let used = backend.used(&unit_id, &paths).await;
                entry["tmpBytes"] = json!(used.first().copied().flatten());
                entry["homeBytes"] = json!(used.get(1).copied().flatten());
                if let Some(egress) = egress {
                    entry["egressBytesUp"] = json!(egress.bytes_up.load(Ordering::Relaxed));
                    entry["egressBytesDown"] = json!(egress.bytes_down.load(Ordering::Relaxed));
                    entry["egressConnections"] = json!(egress.connections.load(Ordering::Relaxed));
                    entry["egressThrottledMs"] =
                        json!(egress.throttled.load(Ordering::Relaxed) / 1_000_000);
                }
                match backend.stats(&unit_id).await {
                    Ok(stats) => {
                        if let (Some(object), Ok(Value::Object(figures))) =
                            (entry.as_object_mut(), serde_json::to_value(stats))
                        {
                            object.extend(figures);
                        }
                    }
                    Err(error) => entry["error"] = json!(error.to_string()),
                }
                entries.push(entry);
            }
            // Figures, names and ids only: nothing here needs redacting.
            reply.answer(result_response(id, json!({"units": entries})));
        });
    }
}

/// The running units `message` asks about (all, or the one `unit` names),
/// each with its backend id.
fn chosen(live: &Live, message: &Value) -> Result<Vec<Asked>, (i64, String)> {
    let invalid = |why: String| (code::INVALID_PARAMS, format!("box/units.stats: {why}"));
    let params = params(message);
    if let Some(unknown) = params.and_then(|p| {
        p.keys()
            .find(|key| !["unit", "_meta"].contains(&key.as_str()))
    }) {
        return Err(invalid(format!(
            "unknown parameter `{unknown}`; it takes unit"
        )));
    }
    let running: Vec<Asked> = live
        .units
        .iter()
        .filter(|unit| !unit.removed && unit.ended.is_none())
        .map(|unit| Asked {
            unit: unit.spec.name.clone(),
            id: unit.envelope.id.clone(),
            home: unit
                .envelope
                .home
                .as_ref()
                .map(|home| PathBuf::from(&home.path)),
            egress: live
                .egress
                .iter()
                .find(|proxy| proxy.unit == unit.spec.name)
                .map(crate::egress::EgressProxy::usage),
        })
        .collect();
    match params.and_then(|p| p.get("unit")) {
        None => Ok(running),
        Some(Value::String(name)) => {
            let names: Vec<String> = running.iter().map(|asked| asked.unit.clone()).collect();
            let found: Vec<Asked> = running
                .into_iter()
                .filter(|asked| asked.unit == *name)
                .collect();
            if found.is_empty() {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                return Err(invalid(format!(
                    "no running unit `{name}`; running: {}",
                    super::named(&names)
                )));
            }
            Ok(found)
        }
        Some(other) => Err(invalid(format!("unit: expected a unit name, got {other}"))),
    }
}
