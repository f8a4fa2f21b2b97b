//! A local unit's usage, read from `/proc` (it has no cgroup of its own):
//! `Backend::stats` over its helper's process tree, `Backend::used` through
//! the process that sees its own mounts. The limit watcher asks both for
//! every unit every second, so a unit of this process is found in the
//! registry (no record read), and the process inside it is kept once found
//! (checked by its start time, one file), leaving one scan of `/proc` per
//! reading, the tree's.

use std::path::{Path, PathBuf};

use crate::adopt::exited_now;
use crate::{LocalBackend, lease};

/// Where the kernel shows the processes.
const PROC: &str = "/proc";

impl LocalBackend {
    /// The helper of unit `id` while it lives: this process's unit from the
    /// registry, else the one its run directory's record names.
    pub(crate) fn live_helper(&self, id: &str) -> Option<u32> {
        if let Some(unit) = self.registry().get(id) {
            return exited_now(&unit.exited)
                .is_none()
                .then(|| u32::try_from(unit.group).ok())
                .flatten();
        }
        self.recorded(id)
            .filter(|(_, record)| record.helper_alive())
            .map(|(_, record)| record.helper)
    }

    /// The usage of unit `id`'s process tree; `None` once it has ended.
    pub(crate) fn usage(&self, id: &str) -> Option<box_backend::stats::UnitStats> {
        box_backend::stats::process_tree(Path::new(PROC), self.live_helper(id)?)
    }

    /// Bytes in use at each of `paths` as unit `id` sees them.
    pub(crate) fn used_at(&self, id: &str, paths: &[PathBuf]) -> Vec<Option<u64>> {
        let proc_root = Path::new(PROC);
        let inside = self.inside(id);
        paths
            .iter()
            .map(|path| inside.and_then(|pid| box_backend::stats::used_in(proc_root, pid, path)))
            .collect()
    }

    /// The first of unit `id`'s processes in a mount namespace of its own
    /// (the helper stays in the host's): for this process's unit the one
    /// found before while it is the same process, else found and kept.
    fn inside(&self, id: &str) -> Option<u32> {
        let proc_root = Path::new(PROC);
        let helper = self.live_helper(id)?;
        let cached = self.registry().get(id).and_then(|unit| unit.inside);
        let found = inside_of(proc_root, helper, cached);
        if found != cached
            && let Some(unit) = self.registry().get_mut(id)
        {
            unit.inside = found;
        }
        found.map(|(pid, _)| pid)
    }
}

/// `cached` (a pid and its start time) while that process is still the
/// same, else the first of `helper`'s descendants in another mount
/// namespace than this process's, with its start time, found in
/// `proc_root`.
pub(crate) fn inside_of(
    proc_root: &Path,
    helper: u32,
    cached: Option<(u32, u64)>,
) -> Option<(u32, u64)> {
    if let Some((pid, start)) = cached
        && lease::start_time_in(proc_root, pid) == Some(start)
    {
        return cached;
    }
    let pid = box_backend::stats::in_own_mount_namespace(proc_root, helper)?;
    Some((pid, lease::start_time_in(proc_root, pid)?))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::inside_of;

    /// A process in a made-up `/proc`: its parent, start time and mount
    /// namespace.
    fn process(root: &Path, pid: &str, ppid: u32, start: u64, namespace: u32) {
        let dir = root.join(pid);
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (box) S {ppid} 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0"),
        )
        .unwrap();
        let link = dir.join("ns/mnt");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("mnt:[{namespace}]"), link).unwrap();
    }

    /// The process inside a unit is found below its helper once, then kept
    /// without a scan of `/proc` while it is the same process; a pid taken
    /// by another process (another start time) is found again.
    #[test]
    fn the_process_inside_a_unit_is_found_once_and_kept_while_it_lives() {
        let proc = tempfile::tempdir().unwrap();
        let root = proc.path();
        process(root, "self", 1, 1, 1);
        process(root, "10", 1, 500, 1);
        process(root, "11", 10, 600, 2);
        process(root, "12", 11, 700, 2);
        let found = inside_of(root, 10, None);
        assert_eq!(found, Some((11, 600)));
        // Kept: with the helper gone from `/proc`, a scan would find nothing.
        std::fs::remove_dir_all(root.join("10")).unwrap();
        assert_eq!(inside_of(root, 10, found), found);
        // Pid 11 is now another process: found again below the helper.
        process(root, "10", 1, 500, 1);
        process(root, "11", 10, 900, 2);
        assert_eq!(inside_of(root, 10, found), Some((11, 900)));
        // No process of the unit is left: nothing is kept.
        std::fs::remove_dir_all(root.join("11")).unwrap();
        std::fs::remove_dir_all(root.join("12")).unwrap();
        assert_eq!(inside_of(root, 10, Some((11, 900))), None);
    }
}
