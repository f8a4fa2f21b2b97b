//! The usage gauges' sampler: every few seconds, what this host's running
//! units use ([`Backend::stats`](box_backend::Backend::stats)), summed per
//! backend and profile into `/metrics` (`box_units_memory_bytes` ...).
//! Only a host that serves `/metrics` (`--listen`) samples.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use box_backend::stats::UnitStats;
use tokio_util::sync::CancellationToken;

use crate::config::HostConfig;
use crate::metrics::UsageKey;
use crate::services::Services;

/// How often the gauges are read again: a scrape sees figures at most this old.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// Sample until `shutdown`.
pub(crate) fn spawn(config: Arc<HostConfig>, services: Arc<Services>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        loop {
            sample(&config, &services).await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(EVERY) => {}
            }
        }
    });
}

/// One reading: this instance's running units, summed per profile.
async fn sample(config: &HostConfig, services: &Services) {
    let backend = services.backend.as_ref();
    let units = match backend.list_instance(&config.instance).await {
        Ok(units) => units,
        Err(error) => {
            tracing::debug!(%error, "listing units for the usage gauges");
            return;
        }
    };
    let mut sums: BTreeMap<UsageKey, UnitStats> = BTreeMap::new();
    for unit in units.iter().filter(|unit| unit.state == "running") {
        let Ok(stats) = backend.stats(&unit.id).await else {
            continue;
        };
        let key = UsageKey {
            backend: backend.kind().as_str().to_owned(),
            profile: unit.profile.clone(),
        };
        add(sums.entry(key).or_default(), &stats);
    }
    let sums: Vec<(UsageKey, UnitStats)> = sums.into_iter().collect();
    services.metrics.set_usage(&sums);
}

/// `stats` added into `sum` (an unknown figure adds nothing).
fn add(sum: &mut UnitStats, stats: &UnitStats) {
    let plus = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    };
    sum.cpu_usec = plus(sum.cpu_usec, stats.cpu_usec);
    sum.memory_bytes = plus(sum.memory_bytes, stats.memory_bytes);
    sum.pids = plus(sum.pids, stats.pids);
    sum.io_read_bytes = plus(sum.io_read_bytes, stats.io_read_bytes);
    sum.io_write_bytes = plus(sum.io_write_bytes, stats.io_write_bytes);
}
