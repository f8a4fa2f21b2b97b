//! A docker unit's resource usage, read from its container's cgroup on this
//! host (box-backend's `stats` parses the files): the systemd driver's
//! `system.slice/docker-ID.scope` or cgroupfs's `docker/ID`, on v2 or v1;
//! where it is not visible here (a remote engine), the engine's one-shot
//! stats.

use std::path::Path;

use box_backend::BackendError;
use box_backend::stats::{Cgroup, UnitStats};

use crate::DockerBackend;

/// Where cgroups are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroup of container `id` (its full id) under `root`, on whichever
/// driver made it.
pub(crate) fn locate(root: &Path, id: &str) -> Option<Cgroup> {
    if id.len() != 64 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    [
        format!("system.slice/docker-{id}.scope"),
        format!("docker/{id}"),
    ]
    .iter()
    .find_map(|relative| Cgroup::find(root, relative))
}

impl DockerBackend {
    /// [`box_backend::Backend::stats`]: the container's cgroup, found from
    /// its full id (asked of the engine when `id` is short).
    pub(crate) async fn unit_stats(&self, id: &str) -> Result<UnitStats, BackendError> {
        let root = Path::new(CGROUP_ROOT);
        if let Some(cgroup) = locate(root, id) {
            return Ok(with_victim(cgroup.read(), id));
        }
        let other = |message: String| BackendError::Other {
            unit: id.to_owned(),
            doing: "reading its resource usage".to_owned(),
            message,
        };
        let inspect = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(|error| other(error.to_string()))?;
        let full = inspect.id.unwrap_or_default();
        if !inspect
            .state
            .and_then(|state| state.running)
            .unwrap_or(false)
        {
            return Err(other("the container is not running".to_owned()));
        }
        if let Some(cgroup) = locate(root, &full) {
            return Ok(with_victim(cgroup.read(), &full));
        }
        // Not on this host (a remote engine, another cgroup namespace): the
        // engine's own one-shot reading, which costs it a cgroup read too.
        let options = bollard::query_parameters::StatsOptions {
            stream: false,
            one_shot: true,
        };
        let mut readings = self.docker.stats(&full, Some(options));
        match futures::StreamExt::next(&mut readings).await {
            Some(Ok(reading)) => Ok(from_engine(&reading)),
            Some(Err(error)) => Err(other(format!(
                "its cgroup is not visible under {CGROUP_ROOT}, and the engine's stats failed: {error}"
            ))),
            None => Err(other(format!(
                "its cgroup is not visible under {CGROUP_ROOT}, and the engine gave no stats"
            ))),
        }
    }
}

/// [`box_backend::Backend::used`]: measured through a process of the
/// container's cgroup, which sees its mounts (`id` is its full id).
pub(crate) fn used(id: &str, paths: &[std::path::PathBuf]) -> Vec<Option<u64>> {
    let process = locate(Path::new(CGROUP_ROOT), id).and_then(|cgroup| cgroup.a_process());
    paths
        .iter()
        .map(|path| {
            process.and_then(|pid| box_backend::stats::used_in(Path::new("/proc"), pid, path))
        })
        .collect()
}

/// `stats` with the last process the OOM killer killed in container `id`,
/// from the kernel's log, once its cgroup counts a kill (the log is read
/// only then; where it cannot be read, the victim stays unknown).
fn with_victim(mut stats: UnitStats, id: &str) -> UnitStats {
    if stats.oom_kills.is_some_and(|kills| kills > 0) {
        match box_backend::stats::kernel_log() {
            Ok(log) => {
                stats.oom_killed = box_backend::stats::oom_kills_in_log(&log, id).pop();
            }
            Err(error) => {
                tracing::debug!(container = id, %error, "the kernel's log cannot be read here: an OOM kill's victim stays unnamed");
            }
        }
    }
    stats
}

/// The engine's stats (`GET /containers/ID/stats`) as a unit's usage.
fn from_engine(reading: &bollard::models::ContainerStatsResponse) -> UnitStats {
    let io = reading
        .blkio_stats
        .as_ref()
        .and_then(|blkio| blkio.io_service_bytes_recursive.as_ref());
    // v1 says `Read`/`Write`, v2 `read`/`write`; absent: unknown.
    let sum = |op: &str| {
        io.map(|entries| {
            entries
                .iter()
                .filter(|entry| {
                    entry
                        .op
                        .as_deref()
                        .is_some_and(|o| o.eq_ignore_ascii_case(op))
                })
                .filter_map(|entry| entry.value)
                .fold(0u64, u64::saturating_add)
        })
    };
    let memory = reading.memory_stats.as_ref();
    UnitStats {
        cpu_usec: reading
            .cpu_stats
            .as_ref()
            .and_then(|cpu| cpu.cpu_usage.as_ref()?.total_usage)
            .map(|ns| ns / 1000),
        memory_bytes: memory.and_then(|memory| memory.usage),
        memory_peak_bytes: memory.and_then(|memory| memory.max_usage),
        pids: reading.pids_stats.as_ref().and_then(|pids| pids.current),
        io_read_bytes: sum("read"),
        io_write_bytes: sum("write"),
        ..UnitStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_stats_are_read_as_a_cgroups() {
        let reading: bollard::models::ContainerStatsResponse =
            serde_json::from_value(serde_json::json!({
                "cpu_stats": {"cpu_usage": {"total_usage": 1_500_000_000u64}},
                "memory_stats": {"usage": 67_108_864u64, "max_usage": 70_000_000u64},
                "pids_stats": {"current": 3},
                "blkio_stats": {"io_service_bytes_recursive": [
                    {"major": 8, "minor": 0, "op": "Read", "value": 4096},
                    {"major": 8, "minor": 0, "op": "Write", "value": 512},
                    {"major": 8, "minor": 0, "op": "Total", "value": 4608},
                    {"major": 8, "minor": 16, "op": "read", "value": 10}
                ]}
            }))
            .expect("a stats reading");
        assert_eq!(
            from_engine(&reading),
            UnitStats {
                cpu_usec: Some(1_500_000),
                memory_bytes: Some(67_108_864),
                memory_peak_bytes: Some(70_000_000),
                pids: Some(3),
                io_read_bytes: Some(4106),
                io_write_bytes: Some(512),
                ..UnitStats::default()
            }
        );
        // v2 engines leave blkio null and max_usage out: unknown, not 0.
        let bare: bollard::models::ContainerStatsResponse =
            serde_json::from_value(serde_json::json!({"blkio_stats": {}}))
                .expect("a stats reading");
        assert_eq!(from_engine(&bare), UnitStats::default());
    }

    #[test]
    fn the_cgroup_is_found_on_either_driver() {
        let id = "4627f14617ab03fdf015b8f4a1206027b03a30e5fb165d537efbd82c1c59e77f";
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join("cgroup.controllers"), "memory\n").expect("write");
        let scope = root.path().join(format!("system.slice/docker-{id}.scope"));
        std::fs::create_dir_all(&scope).expect("mkdir");
        std::fs::write(scope.join("memory.current"), "42\n").expect("write");
        assert_eq!(locate(root.path(), id), Some(Cgroup::V2(scope)));
        assert_eq!(locate(root.path(), &id[..12]), None);
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join(format!("memory/docker/{id}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("memory.usage_in_bytes"), "42\n").expect("write");
        assert!(matches!(locate(root.path(), id), Some(Cgroup::V1 { .. })));
    }
}
