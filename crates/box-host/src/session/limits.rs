//! Limit events: while a session lives, each of its units' usage
//! ([`Backend::stats`](box_backend::Backend::stats)) is read every second
//! and held to its limits; a unit that nears one (90%) or reaches it gets
//! the session a `notifications/box/unit` (`{unit, limit, state, figure,
//! bound}`), the log a WARN line and the audit a `"kind": "limit"` line,
//! once per unit, limit and state. Memory counts its peak where the backend
//! reads one (a spike between two readings still shows); tasks count now.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::Session;
use super::live::Unit;

/// How often the units' usage is read.
const EVERY: Duration = Duration::from_secs(1);

/// The share of a limit at which a unit nears it, in percent.
const NEAR: u64 = 90;

/// One limit of one unit under watch.
struct Watched {
    unit: String,
    id: String,
    limit: &'static str,
    bound: u64,
    /// The last state said: 0 none, 1 near, 2 reached.
    said: u8,
}

impl Session {
    /// Watch the limits of `units` until the session ends (or none of them
    /// can be read any more: they are gone).
    pub(super) fn watch_limits(&self, units: &[Unit]) {
        let mut watched: Vec<Watched> = Vec::new();
        for unit in units {
            for (limit, bound) in [
                ("memory", unit.spec.limits.memory_bytes),
                ("pids", unit.spec.limits.pids),
            ] {
                watched.push(Watched {
                    unit: unit.spec.name.clone(),
                    id: unit.envelope.id.clone(),
                    limit,
                    bound,
                    said: 0,
                });
            }
        }
        if watched.is_empty() {
            return;
        }
        let backend = Arc::clone(&self.services.backend);
        let audit = self.services.audit.clone();
        let general = self.general.clone();
        let cancel = self.cancel.clone();
        let session = self.id.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(EVERY) => {}
                }
                let mut read_any = false;
                let mut ids: Vec<&str> = watched.iter().map(|w| w.id.as_str()).collect();
                ids.dedup();
                let mut readings = Vec::new();
                for id in ids {
                    if let Ok(stats) = backend.stats(id).await {
                        read_any = true;
                        readings.push((id.to_owned(), stats));
                    }
                }
                if !read_any || general.is_closed() {
                    return;
                }
                for watch in &mut watched {
                    let Some((_, stats)) = readings.iter().find(|(id, _)| *id == watch.id) else {
                        continue;
                    };
                    let figure = match watch.limit {
                        "memory" => stats.memory_peak_bytes.max(stats.memory_bytes),
                        _ => stats.pids,
                    };
                    let Some(figure) = figure else { continue };
                    let state = level(figure, watch.bound);
                    if state <= watch.said {
                        continue;
                    }
                    watch.said = state;
                    let word = if state == 2 { "reached" } else { "near" };
                    tracing::warn!(
                        session = %session,
                        unit = %watch.unit,
                        limit = watch.limit,
                        figure,
                        bound = watch.bound,
                        "unit {} {} its {} limit ({figure} of {})",
                        watch.unit,
                        if state == 2 { "reached" } else { "nears" },
                        watch.limit,
                        watch.bound,
                    );
                    let params = json!({
                        "unit": watch.unit,
                        "limit": watch.limit,
                        "state": word,
                        "figure": figure,
                        "bound": watch.bound,
                    });
                    if let Some(audit) = &audit {
                        audit.limit(&session, &params);
                    }
                    let _ = general.try_send(json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/box/unit",
                        "params": params,
                    }));
                }
            }
        });
    }
}

/// 2 when `figure` is at `bound` or above, 1 from [`NEAR`] percent of it,
/// else 0.
fn level(figure: u64, bound: u64) -> u8 {
    if bound == 0 {
        return 0;
    }
    if figure >= bound {
        2
    } else if u128::from(figure) * 100 >= u128::from(bound) * u128::from(NEAR) {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_nears_a_limit_at_ninety_percent_and_reaches_it_at_the_bound() {
        assert_eq!(level(89, 100), 0);
        assert_eq!(level(90, 100), 1);
        assert_eq!(level(99, 100), 1);
        assert_eq!(level(100, 100), 2);
        assert_eq!(level(130, 100), 2);
        assert_eq!(level(5, 0), 0);
        assert_eq!(level(u64::MAX - 1, u64::MAX), 1);
    }
}
