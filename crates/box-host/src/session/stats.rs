//! `box/units.stats {unit?}`: what each of the session's running units uses
//! now (CPU time, memory now and at peak, tasks, block IO), as its backend
//! reads it from the unit's cgroup (a local unit: its processes). A figure
//! the backend cannot read is `null`; a unit whose backend reports none has
//! `error` saying why.

use box_jsonrpc::{code, params, result_response};
use serde_json::{Value, json};

use super::Session;
use super::live::Live;
use super::methods::Request;

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
            for (unit, unit_id) in units {
                let mut entry = json!({"unit": unit, "id": unit_id});
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
fn chosen(live: &Live, message: &Value) -> Result<Vec<(String, String)>, (i64, String)> {
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
    let running: Vec<(String, String)> = live
        .units
        .iter()
        .filter(|unit| !unit.removed && unit.ended.is_none())
        .map(|unit| (unit.spec.name.clone(), unit.envelope.id.clone()))
        .collect();
    match params.and_then(|p| p.get("unit")) {
        None => Ok(running),
        Some(Value::String(name)) => {
            let found: Vec<_> = running
                .iter()
                .filter(|(unit, _)| unit == name)
                .cloned()
                .collect();
            if found.is_empty() {
                let names: Vec<&str> = running.iter().map(|(unit, _)| unit.as_str()).collect();
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
