//! Host instances and their liveness, so `box gc` and a starting host can tell
//! an orphan from a live unit without asking the host that owns it.
//!
//! A host claims its instance id by holding an exclusive `flock` on
//! `<dir>/<id>.lock` for its whole life; the kernel releases it when the
//! process dies, however it dies. An instance is *alive* while someone holds
//! that lock, *dead* when the file exists but nobody does, and *unknown* when
//! there is no file (another boot, or another machine on the same engine).
//! The default directory is /run/box/instances (cleared at boot).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// A held instance: alive while this value lives.
#[derive(Debug)]
pub struct InstanceLock {
    id: String,
    path: PathBuf,
    _lock: Flock<File>,
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
        // The pid, for a human looking at the directory; liveness is the lock.
        let _ = lock.set_len(0);
        let _ = writeln!(lock, "{}", std::process::id());
        Ok(Self {
            id: id.to_owned(),
            path,
            _lock: lock,
        })
    }

    /// The instance id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // A clean exit leaves no file; the lock itself is released on close.
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
