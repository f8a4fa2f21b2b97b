//! Whether the kernel's OOM killer ended a unit, told from the unit's memory
//! cgroup, read while the unit lives.
//!
//! The engine's flag (`State.OOMKilled`) is unreliable on cgroup v1 and goes
//! with an auto-removed container; the cgroup and its counters go too, and
//! the engine removes the cgroup within milliseconds of the init's death
//! (15 ms measured on an idle machine), often before the host has heard of
//! the end. So the backend watches the cgroup from the unit's start and reads
//! it at each OOM event, while it is still there:
//!
//! - cgroup v1: an eventfd registered on `memory.oom_control` through
//!   `cgroup.event_control`; the kernel signals it at each OOM, and once more
//!   when the cgroup is removed (its files then read ENODEV). Registering
//!   needs write access to `cgroup.event_control` (root's on most hosts).
//! - cgroup v2: inotify on `memory.events`, which the kernel marks modified
//!   at each of its events (`oom`, `oom_kill`); removal ends the watch.
//!
//! Without a notification (an unprivileged host on v1) the counters are read
//! when the end is first known, which usually still finds the cgroup.
//! Where the host cannot see the unit's cgroup at all (a remote engine,
//! another cgroup namespace), the evidence says so: a SIGKILL is then
//! "cannot tell", never "not the OOM killer". The cgroup is found from the
//! container's id only (and the init's `/proc/PID/cgroup` where that path
//! names the id), so another host's pid never misleads it.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use box_backend::OomEvidence;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

/// An OOM event this long before the end was first known (or any time
/// after) explains a SIGKILL: the kernel kills at once, and the init's
/// connection closes the moment it dies.
const RECENT: Duration = Duration::from_secs(2);

/// Where cgroups are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A unit's memory cgroup under watch; dropping it ends the watch.
pub(crate) struct OomWatch {
    watcher: Option<Arc<Watcher>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Which cgroup hierarchy the unit's memory cgroup is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

impl Version {
    /// The file that holds the OOM counters.
    fn counters(self) -> &'static str {
        match self {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        }
    }
}

/// What the watch has seen of the cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    /// The cgroup was read at least once.
    read: bool,
    /// OOM kills it counted at its last reading (`oom_kill`).
    kills: u64,
    /// OOM events: v1, the eventfd's signals but the removal's; v2, `oom`.
    events: u64,
    /// When the watch last saw an OOM event or a kill counted.
    last_event: Option<Instant>,
}

/// How the kernel tells the watch of an event.
enum Notify {
    EventFd(EventFd),
    Inotify(Inotify),
}

impl AsRawFd for Notify {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Notify::EventFd(fd) => fd.as_raw_fd(),
            Notify::Inotify(inotify) => inotify.as_fd().as_raw_fd(),
        }
    }
}

struct Watcher {
    version: Version,
    /// The counters file, kept open: v1's eventfd is registered on it.
    counters: std::fs::File,
    notify: Option<AsyncFd<Notify>>,
    seen: Mutex<Seen>,
}

impl OomWatch {
    /// Watch the memory cgroup of container `id`, whose init is `pid` on
    /// the engine's host. Never fails: what it cannot see, it says it
    /// cannot tell. Needs a Tokio runtime (it spawns the watch).
    pub(crate) fn start(id: &str, pid: Option<i64>) -> Self {
        let Some((dir, version)) = locate(Path::new(CGROUP_ROOT), id, pid) else {
            tracing::debug!(
                container = id,
                "its memory cgroup is not visible here: OOM kills cannot be told"
            );
            return Self::blind();
        };
        let Ok(counters) = std::fs::File::open(dir.join(version.counters())) else {
            return Self::blind();
        };
        let notify = match notify(&dir, version, &counters) {
            Ok(notify) => {
                // SAFETY: the `Notify` owns its fd (an `OwnedFd` inside nix's
                // `EventFd` or `Inotify`), moved into the `AsyncFd`, where it
                // stays open and the same for as long as the `AsyncFd` lives.
                unsafe { AsyncFd::register_with_interest(notify, tokio::io::Interest::READABLE) }
                    .ok()
            }
            Err(error) => {
                tracing::debug!(container = id, %error, "no OOM notification from its memory cgroup: read at the unit's end only");
                None
            }
        };
        let watcher = Arc::new(Watcher {
            version,
            counters,
            notify,
            seen: Mutex::new(Seen::default()),
        });
        // The baseline: counts from before (a re-adopted unit) are no event.
        watcher.read_counters(false);
        let task = watcher
            .notify
            .is_some()
            .then(|| tokio::spawn(watch(watcher.clone())));
        Self {
            watcher: Some(watcher),
            task,
        }
    }

    /// A watch that sees nothing: every SIGKILL is "cannot tell".
    pub(crate) fn blind() -> Self {
        Self {
            watcher: None,
            task: None,
        }
    }

    /// Read the cgroup now (events pending first), while it may still be
    /// there: call it the moment the unit's end is known.
    pub(crate) fn refresh(&self) {
        if let Some(watcher) = &self.watcher {
            watcher.drain();
            watcher.read_counters(true);
        }
    }

    /// What the evidence says of an end first known at `known`: an OOM
    /// event from `RECENT` before it on means the OOM killer; none, that it
    /// was not; an unreadable cgroup, that nothing here can tell.
    pub(crate) fn evidence(&self, known: Instant) -> OomEvidence {
        self.refresh();
        let seen = self
            .watcher
            .as_ref()
            .map(|watcher| *watcher.lock())
            .unwrap_or_default();
        judge(&seen, known)
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn judge(seen: &Seen, known: Instant) -> OomEvidence {
    if !seen.read {
        return OomEvidence::Unknown;
    }
    match seen.last_event {
        Some(at) if at + RECENT >= known => OomEvidence::Killed,
        _ => OomEvidence::NotKilled,
    }
}

/// Take every event the kernel signals until the cgroup goes.
async fn watch(watcher: Arc<Watcher>) {
    let Some(notify) = &watcher.notify else {
        return;
    };
    loop {
        let Ok(mut guard) = notify.readable().await else {
            return;
        };
        match guard.try_io(|notify| take(&watcher, notify.get_ref())) {
            Ok(Ok(Gone::No)) | Err(_) => {}
            Ok(Ok(Gone::Yes)) | Ok(Err(_)) => return,
        }
    }
}

/// Whether the cgroup is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    No,
    Yes,
}

/// One read of the notification: its events recorded. `WouldBlock` when
/// none is pending.
fn take(watcher: &Watcher, notify: &Notify) -> std::io::Result<Gone> {
    match notify {
        Notify::EventFd(fd) => {
            let count = fd.read().map_err(std::io::Error::from)?;
            Ok(watcher.signalled(count))
        }
        Notify::Inotify(inotify) => {
            let events = inotify.read_events().map_err(std::io::Error::from)?;
            let ignored = events
                .iter()
                .any(|event| event.mask.contains(AddWatchFlags::IN_IGNORED));
            if watcher.read_counters(true) == Gone::Yes || ignored {
                Ok(Gone::Yes)
            } else {
                Ok(Gone::No)
            }
        }
    }
}

impl Watcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every event pending, without waiting.
    fn drain(&self) {
        if let Some(notify) = &self.notify {
            while let Ok(Gone::No) = take(self, notify.get_ref()) {}
        }
    }

    /// v1: the eventfd was signalled `count` times: each an OOM, but the
    /// cgroup's removal signals it once more (its files then fail to read).
    fn signalled(&self, count: u64) -> Gone {
        let now = Instant::now();
        let text = self.read();
        let mut seen = self.lock();
        match text {
            Some(text) => {
                seen.events += count;
                seen.last_event = Some(now);
                record(&mut seen, self.version, &text, Some(now));
                Gone::No
            }
            None => {
                if count > 1 {
                    seen.events += count - 1;
                    seen.last_event = Some(now);
                }
                Gone::Yes
            }
        }
    }

    /// Read the counters; with `marked`, a count that grew is an event now.
    fn read_counters(&self, marked: bool) -> Gone {
        let Some(text) = self.read() else {
            return Gone::Yes;
        };
        let now = marked.then(Instant::now);
        record(&mut self.lock(), self.version, &text, now);
        Gone::No
    }

    fn read(&self) -> Option<String> {
        let mut buffer = [0u8; 512];
        let length = self.counters.read_at(&mut buffer, 0).ok()?;
        buffer
            .get(..length)
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }
}

/// The counters in `text` (the `version`'s file) into `seen`; where `now`
/// is given, a count that grew (or v1's `under_oom 1`) is an event then.
fn record(seen: &mut Seen, version: Version, text: &str, now: Option<Instant>) {
    seen.read = true;
    let kills = counter(text, "oom_kill").unwrap_or(0);
    let mut event = kills > seen.kills;
    seen.kills = seen.kills.max(kills);
    match version {
        Version::V1 => event |= counter(text, "under_oom") == Some(1),
        Version::V2 => {
            let events = counter(text, "oom").unwrap_or(0);
            event |= events > seen.events;
            seen.events = seen.events.max(events);
        }
    }
    if event && let Some(now) = now {
        seen.last_event = Some(now);
    }
}

/// The value of `name` in a cgroup's flat keyed file (`name value` lines).
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Register for the cgroup's OOM events.
fn notify(dir: &Path, version: Version, counters: &std::fs::File) -> std::io::Result<Notify> {
    match version {
        Version::V1 => {
            let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(std::io::Error::from)?;
            std::fs::write(
                dir.join("cgroup.event_control"),
                format!("{} {}", fd.as_raw_fd(), counters.as_raw_fd()),
            )?;
            Ok(Notify::EventFd(fd))
        }
        Version::V2 => {
            let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
                .map_err(std::io::Error::from)?;
            inotify
                .add_watch(&dir.join(version.counters()), AddWatchFlags::IN_MODIFY)
                .map_err(std::io::Error::from)?;
            Ok(Notify::Inotify(inotify))
        }
    }
}

/// The memory cgroup directory of container `id` under `root`: from its
/// init's `/proc/PID/cgroup` when that path names the id (a custom cgroup
/// parent, the systemd driver), else where the engine's drivers put it.
fn locate(root: &Path, id: &str, pid: Option<i64>) -> Option<(PathBuf, Version)> {
    if id.len() < 12 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let unified = root.join("cgroup.controllers").exists();
    let mut candidates: Vec<(PathBuf, Version)> = Vec::new();
    if let Some(pid) = pid.filter(|pid| *pid > 0)
        && let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
    {
        candidates.extend(from_proc(root, &text, id, unified));
    }
    let (v1, v2) = (root.join("memory"), root);
    candidates.extend([
        (
            v2.join(format!("system.slice/docker-{id}.scope")),
            Version::V2,
        ),
        (v2.join(format!("docker/{id}")), Version::V2),
        (v1.join(format!("docker/{id}")), Version::V1),
        (
            v1.join(format!("system.slice/docker-{id}.scope")),
            Version::V1,
        ),
    ]);
    candidates
        .into_iter()
        .filter(|(_, version)| (*version == Version::V2) == unified)
        .find(|(dir, version)| dir.join(version.counters()).is_file())
}

/// The memory cgroup paths in a `/proc/PID/cgroup` text that name `id`.
fn from_proc(root: &Path, text: &str, id: &str, unified: bool) -> Vec<(PathBuf, Version)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if !path.contains(id) {
                return None;
            }
            let relative = path.trim_start_matches('/');
            if controllers.split(',').any(|name| name == "memory") {
                Some((root.join("memory").join(relative), Version::V1))
            } else if controllers.is_empty() && unified {
                Some((root.join(relative), Version::V2))
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4627f14617ab03fdf015b8f4a1206027b03a30e5fb165d537efbd82c1c59e77f";

    #[test]
    fn counters_are_read_from_both_versions() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        let v2 = "low 0\nhigh 0\nmax 41\noom 3\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(counter(v1, "oom_kill"), Some(2));
        assert_eq!(counter(v1, "oom"), None);
        assert_eq!(counter(v2, "oom"), Some(3));
        assert_eq!(counter(v2, "oom_kill"), Some(1));
        assert_eq!(counter(v2, "oom_group_kill"), Some(0));
    }

    /// A count read at the start is no event; one that grew later is, and
    /// only a recent event explains an end.
    #[test]
    fn a_count_that_grew_is_an_event_and_only_a_recent_one_explains_an_end() {
        let start = Instant::now();
        let mut seen = Seen::default();
        assert_eq!(judge(&seen, start), OomEvidence::Unknown);
        record(&mut seen, Version::V2, "oom 2\noom_kill 2\n", None);
        assert_eq!(seen.last_event, None);
        assert_eq!(judge(&seen, start), OomEvidence::NotKilled);
        record(&mut seen, Version::V2, "oom 2\noom_kill 2\n", Some(start));
        assert_eq!(judge(&seen, start), OomEvidence::NotKilled);
        record(&mut seen, Version::V2, "oom 3\noom_kill 2\n", Some(start));
        assert_eq!(judge(&seen, start), OomEvidence::Killed);
        assert_eq!(judge(&seen, start + RECENT), OomEvidence::Killed);
        assert_eq!(
            judge(&seen, start + RECENT + Duration::from_millis(1)),
            OomEvidence::NotKilled
        );
        let mut v1 = Seen::default();
        record(
            &mut v1,
            Version::V1,
            "oom_kill_disable 0\nunder_oom 1\noom_kill 0\n",
            Some(start),
        );
        assert_eq!(judge(&v1, start), OomEvidence::Killed);
    }

    /// Only a path naming the container's id is taken from `/proc/PID/cgroup`
    /// (a remote engine's pid is some other process here).
    #[test]
    fn only_a_cgroup_naming_the_container_is_taken() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = format!(
            "12:pids:/docker/{ID}\n4:memory:/docker/{ID}\n3:cpu,cpuacct:/docker/{ID}\n0::/docker/{ID}\n"
        );
        assert_eq!(
            from_proc(root, &v1, ID, false),
            vec![(root.join(format!("memory/docker/{ID}")), Version::V1)]
        );
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            from_proc(root, &v2, ID, true),
            vec![(
                root.join(format!("system.slice/docker-{ID}.scope")),
                Version::V2
            )]
        );
        assert_eq!(
            from_proc(root, "0::/user.slice/session-3.scope\n", ID, true),
            vec![]
        );
        assert_eq!(from_proc(root, "4:memory:/user.slice\n", ID, false), vec![]);
    }

    /// A container this host cannot see (a remote engine's) has no cgroup
    /// here: cannot tell, never "not the OOM killer".
    #[tokio::test]
    async fn a_unit_whose_cgroup_is_not_here_cannot_be_told() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(locate(dir.path(), ID, Some(1)), None);
        assert_eq!(locate(dir.path(), "../../etc", None), None);
        let watch = OomWatch::start(&"0".repeat(64), Some(i64::from(i32::MAX)));
        assert_eq!(watch.evidence(Instant::now()), OomEvidence::Unknown);
    }

    /// A cgroup v1 directory as the engine leaves it: found by the id, its
    /// counters read (no eventfd without the kernel's file).
    #[test]
    fn a_v1_cgroup_is_found_and_read() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(format!("memory/docker/{ID}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(
            locate(root.path(), ID, None),
            Some((dir.clone(), Version::V1))
        );
        let watcher = Watcher {
            version: Version::V1,
            counters: std::fs::File::open(dir.join("memory.oom_control")).unwrap(),
            notify: None,
            seen: Mutex::new(Seen::default()),
        };
        assert_eq!(watcher.read_counters(false), Gone::No);
        assert_eq!(watcher.lock().kills, 1);
        assert_eq!(watcher.lock().last_event, None);
        // A signal while the cgroup is there is an OOM event.
        assert_eq!(watcher.signalled(1), Gone::No);
        assert_eq!(judge(&watcher.lock(), Instant::now()), OomEvidence::Killed);
    }
}
