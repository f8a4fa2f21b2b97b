//! Volumes on the host: the storage of every unit's `[[volume]]`, shared by
//! the backends (which mount it) and `box volumes` (which lists and removes
//! it).
//!
//! Each volume is a directory of box's state directory, private to box's
//! user (mode 0700):
//!
//! ```text
//! <volumes>/<backend>/<key>/volume.json   what it is (name, scope, profile, session, last use)
//!                          /lock          held shared by every unit that uses it (local)
//!                          /data/         the content, owned by the unit's user
//! ```
//!
//! The key says whose it is: `p-<profile>-<name>` for a volume every session
//! of a profile shares, `s-<instance>-<session>-<name>` for one session's.
//! A docker unit mounts it through a named volume bound to `data`
//! (the docker backend's), a local unit binds `data` itself.
//!
//! A local unit's sandbox helper holds `lock` shared for the unit's whole
//! life, so a removal (which takes it exclusive, without waiting) never
//! pulls a volume from under a live local unit; the engine refuses to
//! remove a named volume a container uses, which guards docker units.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use box_policy::envelope::BackendKind;
use box_policy::plan::{UserIds, Volume, VolumeScope};

use crate::{SessionLabel, safe_name};

/// Where volumes live unless a host says otherwise: `$XDG_STATE_HOME/box/volumes`,
/// else `~/.local/state/box/volumes`, and `/var/lib/box/volumes` as root.
pub fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir).join("box").join("volumes");
    }
    let root = nix::unistd::getuid().is_root();
    match std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        Some(home) if !root => PathBuf::from(home)
            .join(".local")
            .join("state")
            .join("box")
            .join("volumes"),
        _ if root => PathBuf::from("/var/lib/box/volumes"),
        _ => crate::default_runtime_dir().join("volumes"),
    }
}

/// What a volume is, kept beside its data (`volume.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRecord {
    /// Its name in the profile.
    pub name: String,
    /// The backend whose units mount it.
    pub backend: String,
    /// `session` or `profile`.
    pub scope: String,
    /// The profile it was made for.
    pub profile: String,
    /// The host instance of its session (session scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Its session (session scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// When it was made (seconds since the epoch).
    pub created: u64,
    /// When a unit last started with it (seconds since the epoch).
    pub last_used: u64,
}

/// A volume made ready for a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedVolume {
    /// Its key (the directory's name; the docker backend's named volume is
    /// made from it).
    pub key: String,
    /// Its content's directory on the host.
    pub data: PathBuf,
    /// The file a local unit holds locked while it uses the volume.
    pub lock: PathBuf,
}

/// A volume as `box volumes ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVolume {
    /// Its key.
    pub key: String,
    /// Its directory.
    pub dir: PathBuf,
    /// What it is.
    pub record: VolumeRecord,
    /// Bytes of its content (what box's user can see of it).
    pub bytes: u64,
}

/// The volumes beneath one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStore {
    root: PathBuf,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or_default()
}

/// The key of `volume` for `session`'s units.
pub fn key(volume: &Volume, session: &SessionLabel) -> String {
    match volume.scope {
        VolumeScope::Profile => format!("p-{}-{}", safe_name(&session.profile), volume.name),
        VolumeScope::Session => format!(
            "s-{}-{}-{}",
            safe_name(&session.instance),
            safe_name(&session.session),
            volume.name
        ),
    }
}

impl Default for VolumeStore {
    fn default() -> Self {
        Self::new(default_dir())
    }
}

impl VolumeStore {
    /// The volumes beneath `root`.
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// Where they are.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn backend_dir(&self, backend: BackendKind) -> PathBuf {
        self.root.join(backend.as_str())
    }

    /// Make `volume` ready for a unit of `session` on `backend` running as
    /// `owner` (`None`: an image's user known by name only): its directory
    /// made when new (0700, box's user's), its content's directory handed
    /// to the unit's user (where box can: as root; else made writable by
    /// every user, inside box's private directory), and its last use noted.
    pub fn prepare(
        &self,
        backend: BackendKind,
        volume: &Volume,
        session: &SessionLabel,
        owner: Option<UserIds>,
    ) -> Result<PreparedVolume, String> {
        let key = key(volume, session);
        let dir = self.backend_dir(backend).join(&key);
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true).mode(0o700);
        builder
            .create(&dir)
            .map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let data = dir.join("data");
        match std::fs::create_dir(&data) {
            Ok(()) => hand_over(&data, owner)?,
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(format!("creating {}: {error}", data.display())),
        }
        let lock = dir.join("lock");
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock)
            .map_err(|error| format!("creating {}: {error}", lock.display()))?;
        let meta = dir.join("volume.json");
        let created = read_record(&meta).map(|record| record.created);
        let record = VolumeRecord {
            name: volume.name.clone(),
            backend: backend.as_str().to_owned(),
            scope: volume.scope.as_str().to_owned(),
            profile: session.profile.clone(),
            instance: (volume.scope == VolumeScope::Session).then(|| session.instance.clone()),
            session: (volume.scope == VolumeScope::Session).then(|| session.session.clone()),
            created: created.unwrap_or_else(now),
            last_used: now(),
        };
        write_record(&meta, &record)?;
        Ok(PreparedVolume { key, data, lock })
    }

    /// Every volume of every backend, sorted by backend and key.
    pub fn list(&self) -> Vec<ListedVolume> {
        let mut listed = Vec::new();
        let Ok(backends) = std::fs::read_dir(&self.root) else {
            return listed;
        };
        for backend in backends.flatten() {
            let Ok(volumes) = std::fs::read_dir(backend.path()) else {
                continue;
            };
            for entry in volumes.flatten() {
                let dir = entry.path();
                let Some(record) = read_record(&dir.join("volume.json")) else {
                    continue;
                };
                listed.push(ListedVolume {
                    key: entry.file_name().to_string_lossy().into_owned(),
                    bytes: size_of(&dir.join("data")),
                    dir,
                    record,
                });
            }
        }
        listed.sort_by(|a, b| (&a.record.backend, &a.key).cmp(&(&b.record.backend, &b.key)));
        listed
    }

    /// The session-scoped volumes of `session` on `backend`.
    pub fn of_session(&self, backend: BackendKind, session: &SessionLabel) -> Vec<ListedVolume> {
        self.list()
            .into_iter()
            .filter(|volume| {
                volume.record.backend == backend.as_str()
                    && volume.record.scope == VolumeScope::Session.as_str()
                    && volume.record.instance.as_deref() == Some(session.instance.as_str())
                    && volume.record.session.as_deref() == Some(session.session.as_str())
            })
            .collect()
    }
}

/// Whether a local unit holds `volume`'s lock (uses it now).
pub fn in_use_locally(volume: &ListedVolume) -> bool {
    match try_exclusive(&volume.dir.join("lock")) {
        Ok(Some(_held)) => false,
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Remove `volume`'s directory, unless a local unit holds its lock: then
/// an error saying so. (A docker unit's use is the engine's to refuse: the
/// docker backend removes its named volume first.)
pub fn remove(volume: &ListedVolume) -> Result<(), String> {
    let lock = volume.dir.join("lock");
    let held = try_exclusive(&lock).map_err(|error| format!("{}: {error}", lock.display()))?;
    if held.is_none() {
        return Err(format!(
            "volume {} ({}) is in use by a running unit; end its session first",
            volume.record.name, volume.key
        ));
    }
    make_removable(&volume.dir.join("data"));
    std::fs::remove_dir_all(&volume.dir)
        .map_err(|error| format!("removing {}: {error}", volume.dir.display()))
}

/// An exclusive lock on `path` taken without waiting: `None` when another
/// holds it (shared or exclusive). A missing file is nobody's.
fn try_exclusive(path: &Path) -> std::io::Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    let file = match std::fs::OpenOptions::new().read(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            // Nothing to hold: made anew, so the caller's removal proceeds.
            let made = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(path)?;
            return Ok(
                nix::fcntl::Flock::lock(made, nix::fcntl::FlockArg::LockExclusiveNonblock).ok(),
            );
        }
        Err(error) => return Err(error),
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(Some(held)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(errno.into()),
    }
}

/// Take `lock` shared for as long as the returned handle lives: a local
/// unit's helper holds it while the unit uses the volume.
pub fn hold_shared(lock: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_cloexec())
        .open(lock)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock)
        .or_else(|(file, _)| nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockShared))
        .map_err(|(_, errno)| errno.into())
}

fn libc_cloexec() -> i32 {
    nix::fcntl::OFlag::O_CLOEXEC.bits()
}

/// The content's directory handed to the unit's user: theirs (box as root),
/// or box's own when that is who the unit runs as; else writable by every
/// user (box's private parent keeps other host users out).
fn hand_over(data: &Path, owner: Option<UserIds>) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    let (mode, chown) = match owner {
        Some(ids) if ids.uid == me => (0o700, None),
        Some(ids) if me == 0 => (0o700, Some(ids)),
        Some(_) | None => (0o777, None),
    };
    if let Some(ids) = chown {
        std::os::unix::fs::chown(data, Some(ids.uid), Some(ids.gid))
            .map_err(|error| format!("handing {} to the unit's user: {error}", data.display()))?;
    }
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(mode))
        .map_err(|error| format!("{}: {error}", data.display()))
}

/// Directories a unit left without write permission (Go's module cache is
/// read-only) made removable, as `go clean -modcache` does.
fn make_removable(dir: &Path) {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            let mode = metadata.permissions().mode();
            if mode & 0o700 != 0o700 {
                let _ =
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | 0o700));
            }
            if let Ok(entries) = std::fs::read_dir(&path) {
                pending.extend(entries.flatten().map(|entry| entry.path()));
            }
        }
    }
}

fn read_record(path: &Path) -> Option<VolumeRecord> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Write `record` to `path` through a file beside it (a reader never sees
/// half of one).
fn write_record(path: &Path, record: &VolumeRecord) -> Result<(), String> {
    let partial = path.with_extension(format!("{:016x}.partial", rand::random::<u64>()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(|error| format!("{}: {error}", partial.display()))?;
    let text = serde_json::to_vec_pretty(record).unwrap_or_default();
    file.write_all(&text)
        .map_err(|error| format!("{}: {error}", partial.display()))?;
    std::fs::rename(&partial, path).map_err(|error| {
        let _ = std::fs::remove_file(&partial);
        format!("{}: {error}", path.display())
    })
}

/// Bytes beneath `dir` (files' lengths; links not followed).
fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                pending.extend(entries.flatten().map(|entry| entry.path()));
            }
        } else {
            total += metadata.len();
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use pretty_assertions::assert_eq;

    use super::*;

    fn session(name: &str) -> SessionLabel {
        SessionLabel {
            instance: "box-1".to_owned(),
            session: name.to_owned(),
            profile: "dev".to_owned(),
        }
    }

    fn volume(name: &str, scope: VolumeScope) -> Volume {
        Volume {
            scope,
            ..Volume::new(
                name.to_owned(),
                box_policy::plan::VolumePath::Home(PathBuf::from(".cache/pip")),
            )
        }
    }

    #[test]
    fn a_profile_volume_is_one_for_every_session_and_a_session_volume_each_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = VolumeStore::new(dir.path().to_path_buf());
        let me = UserIds {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        let shared = volume("pip", VolumeScope::Profile);
        let one = store
            .prepare(BackendKind::Local, &shared, &session("a"), Some(me))
            .unwrap();
        let two = store
            .prepare(BackendKind::Local, &shared, &session("b"), Some(me))
            .unwrap();
        assert_eq!(one, two);
        assert_eq!(one.key, "p-dev-pip");
        std::fs::write(one.data.join("wheel"), b"12345").unwrap();
        let own = volume("scratch", VolumeScope::Session);
        let a = store
            .prepare(BackendKind::Local, &own, &session("a"), Some(me))
            .unwrap();
        let b = store
            .prepare(BackendKind::Docker, &own, &session("b"), Some(me))
            .unwrap();
        assert_ne!(a.data, b.data);
        assert_eq!(a.key, "s-box-1-a-scratch");
        let mode = std::fs::metadata(a.data.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let listed = store.list();
        let keys: Vec<(&str, &str, u64)> = listed
            .iter()
            .map(|volume| {
                (
                    volume.record.backend.as_str(),
                    volume.key.as_str(),
                    volume.bytes,
                )
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                ("docker", "s-box-1-b-scratch", 0),
                ("local", "p-dev-pip", 5),
                ("local", "s-box-1-a-scratch", 0),
            ]
        );
        assert_eq!(store.of_session(BackendKind::Local, &session("a")).len(), 1);
        assert_eq!(listed[1].record.profile, "dev");
        assert_eq!(listed[1].record.session, None);
    }

    #[test]
    fn a_volume_a_unit_holds_is_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = VolumeStore::new(dir.path().to_path_buf());
        let prepared = store
            .prepare(
                BackendKind::Local,
                &volume("pip", VolumeScope::Profile),
                &session("a"),
                None,
            )
            .unwrap();
        let held = hold_shared(&prepared.lock).unwrap();
        let listed = store.list().remove(0);
        assert!(in_use_locally(&listed));
        let refused = remove(&listed).unwrap_err();
        assert!(refused.contains("is in use by a running unit"), "{refused}");
        drop(held);
        assert!(!in_use_locally(&listed));
        // A read-only directory left inside (Go's module cache) is no obstacle.
        let stuck = prepared.data.join("mod");
        std::fs::create_dir(&stuck).unwrap();
        std::fs::write(stuck.join("f"), b"x").unwrap();
        std::fs::set_permissions(&stuck, std::fs::Permissions::from_mode(0o555)).unwrap();
        remove(&listed).unwrap();
        assert!(store.list().is_empty());
    }
}
