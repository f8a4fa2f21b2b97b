//! A docker unit's resource usage, read from its container's cgroup on this
//! host (box-backend's `stats` parses the files): the systemd driver's
//! `system.slice/docker-ID.scope` or cgroupfs's `docker/ID`, on v2 or v1.

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
            return Ok(cgroup.read());
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
        locate(root, &full).map(|cgroup| cgroup.read()).ok_or_else(|| {
            other(format!(
                "its cgroup is not visible under {CGROUP_ROOT} (neither system.slice/docker-{full}.scope nor docker/{full}): is the engine on another host?"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
