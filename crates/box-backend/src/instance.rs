//! Host instances and their liveness, so `box gc` and a starting host can tell
//! an orphan from a live unit without asking the host that owns it.
//!
//! A host claims its instance id by holding an exclusive `flock` on
//! `<dir>/<id>.lock` for its whole life; the kernel releases it when the
//! process dies, however it dies. An instance is *alive* while someone holds
//! that lock, *dead* when the file exists but nobody does, and *unknown* when
//! there is no file (another boot, or another machine on the same engine).
//! The default directory is /run/box/instances (cleared at boot).
//!
//! A live host also refreshes its lock file's modification time every
//! [`HEARTBEAT`], so once it is dead the file says when it was last alive:
//! a unit it renewed cannot hold a live lease past that time plus the
//! heartbeat plus the unit's lease ([`lease_may_be_live`]). `box gc` and the
//! start-up sweep leave such a unit to its own init until then.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Where instance locks live: `$BOX_INSTANCE_DIR`, else /run/box/instances
/// when it can be created, else `$XDG_RUNTIME_DIR/box/instances`, else the
/// temp directory.
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BOX_INSTANCE_DIR") {
        return PathBuf::from(dir);
    }
    let run = PathBuf::from("/run/box/instances");
    if std::fs::create_dir_all(&run).is_ok() {
        return run;
    }
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(xdg).join("box/instances");
    }
    std::env::temp_dir().join(format!("box-{}/instances", nix::unistd::getuid()))
}

/// A fresh instance id: the boot id's first 8 hex digits, the pid and a random
/// suffix, so ids never repeat across processes or boots.
pub fn new_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| {
            b.trim()
                .replace('-', "")
                .chars()
                .take(8)
                .collect::<String>()
        })
        .unwrap_or_else(|_| "00000000".to_owned());
    let suffix: u32 = rand::random();
    format!("{boot}-{}-{:06x}", std::process::id(), suffix & 0xff_ffff)
}

/// How often a live host refreshes its lock file's modification time.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// Added to every bound on a dead host's last sign of life: a heartbeat
/// thread that ran late, clocks read a moment apart.
const HEARTBEAT_SLACK: Duration = Duration::from_secs(2);

/// A held instance: alive while this value lives.
#[derive(Debug)]
pub struct InstanceLock {
    id: String,
    path: PathBuf,
    _lock: Flock<File>,
    /// Dropped with the lock, which ends the heartbeat thread.
    _heartbeat: mpsc::Sender<()>,
    previous_heartbeat: Option<SystemTime>,
    /// Leave the file when dropped (see [`InstanceLock::adopt`]).
    keep_file: bool,
}

/// Why an instance could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The id is not a plain name.
    #[error("instance id `{0}`: use letters, digits, '-', '_' or '.' only")]
    BadId(String),
    /// Another live host holds it.
    #[error("instance `{id}` is held by another live host (lock {path}); pick another id")]
    Held {
        /// The id.
        id: String,
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file could not be made.
    #[error("instance lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn valid(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn lock_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.lock"))
}

impl InstanceLock {
    /// Claim `id` in `dir` for as long as the returned value lives.
    pub fn acquire(dir: &Path, id: &str) -> Result<Self, InstanceError> {
        if !valid(id) {
            return Err(InstanceError::BadId(id.to_owned()));
        }
        let path = lock_path(dir, id);
        let io = |source| InstanceError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(InstanceError::Held {
                    id: id.to_owned(),
                    path,
                });
            }
            Err((_, errno)) => return Err(io(std::io::Error::from(errno))),
        };
        // A dead predecessor's last sign of life, before this host's own.
        let previous_heartbeat = lock
            .metadata()
            .ok()
            .filter(|metadata| metadata.len() > 0)
            .and_then(|metadata| metadata.modified().ok());
        // The pid, for a human looking at the directory; liveness is the lock.
        let _ = lock.set_len(0);
        let _ = writeln!(lock, "{}", std::process::id());
        let beat = lock.try_clone().map_err(io)?;
        let (heartbeat, stop) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("box-heartbeat".to_owned())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(HEARTBEAT) {
                    let _ = beat.set_modified(SystemTime::now());
                }
            })
            .map_err(io)?;
        Ok(Self {
            id: id.to_owned(),
            path,
            _lock: lock,
            _heartbeat: heartbeat,
            previous_heartbeat,
            keep_file: false,
        })
    }

    /// Claim a *dead* host's `id` for the units of it this host re-adopted
    /// (they keep its label): while held, that instance is alive to every
    /// sweep and `box gc`. Dropped, the file stays with its last heartbeat,
    /// so units still running on their leases are judged by it as any dead
    /// host's are, never taken for an unknown host's.
    pub fn adopt(dir: &Path, id: &str) -> Result<Self, InstanceError> {
        let mut lock = Self::acquire(dir, id)?;
        lock.keep_file = true;
        Ok(lock)
    }

    /// When the host that held this id before (dead, or this would not have
    /// been claimed) was last alive, if one left its file.
    pub fn previous_heartbeat(&self) -> Option<SystemTime> {
        self.previous_heartbeat
    }

    /// The instance id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // A clean exit leaves no file; the lock itself is released on close.
        if self.keep_file {
            let _ = std::fs::File::options()
                .write(true)
                .open(&self.path)
                .and_then(|file| file.set_modified(SystemTime::now()));
            return;
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether an instance's host is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its lock is held.
    Alive,
    /// Its lock file exists and nobody holds it: the host died.
    Dead,
    /// No lock file here: another boot, or a host on another machine.
    Unknown,
}

/// The liveness of instance `id` as seen from `dir`.
pub fn liveness(dir: &Path, id: &str) -> Liveness {
    if !valid(id) {
        return Liveness::Unknown;
    }
    let Ok(file) = File::open(lock_path(dir, id)) else {
        return Liveness::Unknown;
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        // Dropping the Flock releases our probe at once.
        Ok(_probe) => Liveness::Dead,
        Err(_) => Liveness::Alive,
    }
}

/// When instance `id`'s host was last seen alive: its lock file's
/// modification time, which a live host refreshes every [`HEARTBEAT`].
pub fn heartbeat(dir: &Path, id: &str) -> Option<SystemTime> {
    if !valid(id) {
        return None;
    }
    std::fs::metadata(lock_path(dir, id))
        .and_then(|metadata| metadata.modified())
        .ok()
}

/// Whether a unit of a dead host may still hold a live lease, and if so the
/// time by which it has lapsed at the latest: its host renewed it at most
/// until it died, which was within a [`HEARTBEAT`] of `last_alive`.
///
/// A unit that is not running holds nothing (its init is gone); a unit with
/// no recorded lease (`lease_ms` `None`: made before leases, or by a backend
/// whose units die with their host) has nothing to wait for. Either is
/// collectable at once.
pub fn lease_may_be_live(
    state: &str,
    lease_ms: Option<u64>,
    last_alive: SystemTime,
    now: SystemTime,
) -> Option<SystemTime> {
    if state != "running" {
        return None;
    }
    let lapsed_by = last_alive + HEARTBEAT + HEARTBEAT_SLACK + Duration::from_millis(lease_ms?);
    (now < lapsed_by).then_some(lapsed_by)
}

/// The pid the holder of instance `id` wrote into its lock file (for a
/// human, and for `box serve --takeover`, which signals it); `None` when
/// there is no file or no pid in it. Whether it is alive is [`liveness`].
pub fn holder_pid(dir: &Path, id: &str) -> Option<i32> {
    if !valid(id) {
        return None;
    }
    std::fs::read_to_string(lock_path(dir, id))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Remove a dead instance's lock file (after its units are gone).
pub fn forget(dir: &Path, id: &str) {
    if valid(id) && liveness(dir, id) == Liveness::Dead {
        let _ = std::fs::remove_file(lock_path(dir, id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_instance_is_alive_and_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let held = InstanceLock::acquire(dir.path(), "a1").unwrap();
        assert_eq!(liveness(dir.path(), "a1"), Liveness::Alive);
        assert!(matches!(
            InstanceLock::acquire(dir.path(), "a1"),
            Err(InstanceError::Held { .. })
        ));
        assert_eq!(liveness(dir.path(), "b2"), Liveness::Unknown);
        drop(held);
        assert_eq!(liveness(dir.path(), "a1"), Liveness::Unknown);
    }

    #[test]
    fn an_unheld_file_is_dead() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c3.lock"), "1\n").unwrap();
        assert_eq!(liveness(dir.path(), "c3"), Liveness::Dead);
        forget(dir.path(), "c3");
        assert_eq!(liveness(dir.path(), "c3"), Liveness::Unknown);
    }

    #[test]
    fn a_live_host_refreshes_its_heartbeat_and_a_successor_sees_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let held = InstanceLock::acquire(dir.path(), "h1").unwrap();
        assert_eq!(held.previous_heartbeat(), None, "a fresh file has none");
        let old = SystemTime::now() - Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(dir.path().join("h1.lock"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(heartbeat(dir.path(), "h1"), Some(old));
        std::thread::sleep(HEARTBEAT + Duration::from_millis(500));
        let beat = heartbeat(dir.path(), "h1").unwrap();
        assert!(beat > old + Duration::from_secs(3000), "{beat:?}");
        drop(held);
        // Dead (a lock file left, nobody holding it): the successor reads it.
        let dead = dir.path().join("h2.lock");
        std::fs::write(&dead, "1\n").unwrap();
        File::options()
            .write(true)
            .open(&dead)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let next = InstanceLock::acquire(dir.path(), "h2").unwrap();
        assert_eq!(next.previous_heartbeat(), Some(old));
    }

    #[test]
    fn a_dead_hosts_running_unit_is_left_until_its_lease_has_surely_lapsed() {
        let died = SystemTime::now();
        let lease = Some(30_000);
        let by = died + HEARTBEAT + HEARTBEAT_SLACK + Duration::from_secs(30);
        assert_eq!(lease_may_be_live("running", lease, died, died), Some(by));
        assert_eq!(
            lease_may_be_live("running", lease, died, by - Duration::from_secs(1)),
            Some(by)
        );
        assert_eq!(lease_may_be_live("running", lease, died, by), None);
        assert_eq!(lease_may_be_live("exited", lease, died, died), None);
        assert_eq!(lease_may_be_live("created", lease, died, died), None);
        assert_eq!(lease_may_be_live("running", None, died, died), None);
    }

    #[test]
    fn ids_are_plain_names() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            InstanceLock::acquire(dir.path(), "../x"),
            Err(InstanceError::BadId(_))
        ));
        let id = new_id();
        assert!(valid(&id), "{id}");
    }
}
