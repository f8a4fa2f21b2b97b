//! Persisted session identities (`box serve --state DIR`): what a later host
//! process needs to re-adopt a session's live units and serve the same
//! session id to a client that proves it holds the session's reattach secret.
//!
//! One file per session, `<session id>.json`, written atomically (a temporary
//! file in the same directory, fsync, rename, fsync of the directory), and its
//! call journal, `<session id>.calls`. The directory must be the host user's
//! and writable by no one else (it is created 0700; one that is not so is
//! refused, never chmod-ed), and every file box writes there is created anew
//! through the directory's descriptor, `O_EXCL | O_NOFOLLOW`, 0600: a link
//! planted at one of its names is refused and logged, never followed. A file
//! that is not valid JSON, of another version, not a regular file, not owned
//! by this user, readable or writable by others, or whose name and content
//! disagree is logged and ignored, never trusted. The file holds no secret: the reattach secret as a
//! SHA-256 digest only, and no unit key (a unit's key is read back from the
//! engine, which holds it in the container's configuration anyway).

use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest as _;

use box_backend::StartedUnit;
use box_policy::plan::Plan;
use box_policy::profile::Profile;

/// The state file's format version; a file of any other is ignored.
pub const VERSION: u32 = 1;

/// A session's persisted identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionRecord {
    /// [`VERSION`].
    pub version: u32,
    /// The session id (HTTP's `Mcp-Session-Id`).
    pub session: String,
    /// The instance id of the host serving it: a later host re-adopts the
    /// session only once that host is dead (its instance lock is free) or
    /// when it is that instance itself.
    pub instance: String,
    /// SHA-256 of the reattach secret, hex.
    pub secret_sha256: String,
    /// The profile's name.
    pub profile: String,
    /// The tightening the session asked, as sent (`null` for none).
    pub tighten: Value,
    /// SHA-256 of the resolved plan as JSON ([`plan_digest`]).
    pub plan_digest: String,
    /// The protocol version the session's executors were initialized at.
    pub protocol_version: String,
    /// When the session started (milliseconds since the Unix epoch): its
    /// lifetime counts from here across restarts.
    pub started_unix_ms: u64,
    /// The initialize result the client got, without `box.session`.
    pub initialize: Value,
    /// The session's units, in the plan's order.
    pub units: Vec<UnitRecord>,
}

/// One unit of a persisted session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnitRecord {
    /// Its name in the plan.
    pub name: String,
    /// The backend that runs it.
    pub backend: String,
    /// The backend's id (container id).
    pub id: String,
    /// Its identity in its init's proofs.
    pub identity: String,
    /// The image id its container was created from.
    pub image_id: String,
    /// The image's registry digest, when known.
    pub image_digest: Option<String>,
    /// Its run directory on the host.
    pub run_dir: PathBuf,
    /// The envelope reported at start.
    pub envelope: Value,
    /// Its tool list, read before anything ran in it.
    pub tools: Option<Value>,
    /// Its egress proxy's socket directory (network mode `egress`), which the
    /// unit has mounted: a later host serves the proxy there again. Absent
    /// in records of hosts that kept none (they cannot reattach egress units).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_dir: Option<PathBuf>,
}

/// SHA-256 of a plan as JSON, hex: equal plans, equal digests.
pub fn plan_digest(plan: &Plan) -> String {
    let text = serde_json::to_vec(&plan.to_json()).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(&text))
}

/// Now, in milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// A new reattach secret (128 random bits, hex) and its SHA-256 digest.
pub fn new_secret() -> (String, String) {
    let secret = format!("{:032x}", rand::random::<u128>());
    let digest = secret_digest(&secret);
    (secret, digest)
}

/// SHA-256 of `secret`, hex.
pub fn secret_digest(secret: &str) -> String {
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

/// Whether `secret` is the one whose digest is `digest`, compared in time
/// independent of where they differ.
pub fn secret_matches(secret: &str, digest: &str) -> bool {
    let given = secret_digest(secret);
    given.len() == digest.len()
        && given
            .bytes()
            .zip(digest.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Whether `id` may name a state file (the ids box mints are hex).
fn file_safe(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

/// The state directory, held open: every file in it is reached through the
/// directory's descriptor (`openat`, `renameat`, `unlinkat`), so a directory
/// swapped for another after the check still is not written.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    fd: Arc<OwnedFd>,
}

/// Opening a file box creates in the state directory: a new file only
/// (`O_EXCL`, so nothing planted under its name is opened), never through a
/// symbolic link (`O_NOFOLLOW`), 0600.
const CREATE: OFlag = OFlag::O_WRONLY
    .union(OFlag::O_CREAT)
    .union(OFlag::O_EXCL)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opening a file box reads from the state directory: never through a
/// symbolic link, and without waiting on a FIFO planted there.
const READ: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_CLOEXEC);

/// A uid as people read it: `uid 1000 (alice)`, the name from
/// `/etc/passwd` when it has one (box is a static binary: no NSS lookups).
fn owner_name(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|passwd| {
            passwd.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                (fields.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
            })
        });
    match name {
        Some(name) => format!("uid {uid} ({name})"),
        None => format!("uid {uid}"),
    }
}

/// What a name in the state directory is, when it is not box's regular file.
fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR | libc::S_IFBLK => "a device",
        _ => "not a regular file",
    }
}

/// Why a state directory owned by `uid` with `mode` is refused to the user
/// `me`, if it is: another user's, or writable by the group or others (any
/// of whom could plant a link that turns the host's writes on its own files).
fn refusal(dir: &Path, uid: u32, mode: u32, me: u32) -> Option<String> {
    let mode = mode & 0o7777;
    if uid != me {
        return Some(format!(
            "--state {}: owned by {}, mode {mode:04o}, not by this user ({}): another user's directory could be made to plant or read the host's session records; use a directory of your own (`mkdir -m 700 DIR`), or leave --state to its default",
            dir.display(),
            owner_name(uid),
            owner_name(me),
        ));
    }
    let writers = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "its group and every user",
        (true, false) => "its group",
        (false, true) => "every user",
        (false, false) => return None,
    };
    Some(format!(
        "--state {}: mode {mode:04o} (owned by {}) lets {writers} write it: whoever can could plant a link that turns the host's writes on files of its own; `chmod 700 {}`, or use a directory only you can write",
        dir.display(),
        owner_name(uid),
        dir.display(),
    ))
}

impl Store {
    /// Opens `dir`, creating what is missing (mode 0700). Refuses a
    /// directory owned by another user, or one its group or others may
    /// write, naming its mode and owner and what to do; an existing
    /// directory's mode is never changed.
    pub fn open(dir: &Path) -> Result<Self, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| format!("--state {}: creating it: {error}", dir.display()))?;
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|error| format!("--state {}: opening it: {error}", dir.display()))?;
        let stat = nix::sys::stat::fstat(&fd)
            .map_err(|error| format!("--state {}: {error}", dir.display()))?;
        if let Some(why) = refusal(
            dir,
            stat.st_uid,
            stat.st_mode,
            nix::unistd::geteuid().as_raw(),
        ) {
            return Err(why);
        }
        Ok(Self {
            dir: dir.to_owned(),
            fd: Arc::new(fd),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_name(session: &str) -> Option<String> {
        file_safe(session).then(|| format!("{session}.json"))
    }

    fn journal_name(session: &str) -> Option<String> {
        file_safe(session).then(|| format!("{session}.calls"))
    }

    /// What is at `name` when it is not a regular file of this user's (a
    /// link or anything else planted there); `None` when nothing is there or
    /// it is box's.
    fn planted(&self, name: &str) -> Option<String> {
        let stat = nix::sys::stat::fstatat(&*self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Some(kind_of(stat.st_mode).to_owned());
        }
        let me = nix::unistd::geteuid().as_raw();
        (stat.st_uid != me).then(|| format!("a file owned by {}", owner_name(stat.st_uid)))
    }

    /// A new file `name` (see [`CREATE`]).
    fn create(&self, name: &str) -> std::io::Result<std::fs::File> {
        nix::fcntl::openat(&*self.fd, name, CREATE, Mode::from_bits_truncate(0o600))
            .map(std::fs::File::from)
            .map_err(std::io::Error::from)
    }

    /// Writes `record` atomically, mode 0600: a new temporary file, fsync,
    /// renamed over the record, fsync of the directory. Something other than
    /// box's file at the record's name (a planted link) is refused, never
    /// followed.
    pub fn write(&self, record: &SessionRecord) -> Result<(), String> {
        let name = Self::record_name(&record.session).ok_or_else(|| {
            format!(
                "session id `{}` cannot name a state file (letters, digits, - and _ only)",
                record.session
            )
        })?;
        let path = self.dir.join(&name);
        if let Some(what) = self.planted(&name) {
            return Err(format!(
                "{}: {what} is there, not box's record: refused, not followed; remove it (someone who can write the state directory put it there)",
                path.display()
            ));
        }
        let text = serde_json::to_vec_pretty(record)
            .map_err(|error| format!("encoding the session's state: {error}"))?;
        let temporary = format!(".{}.{:016x}.tmp", record.session, rand::random::<u64>());
        let written = (|| -> std::io::Result<()> {
            let mut file = self.create(&temporary)?;
            file.write_all(&text)?;
            file.sync_all()?;
            nix::fcntl::renameat(&*self.fd, temporary.as_str(), &*self.fd, name.as_str())?;
            nix::unistd::fsync(&*self.fd)?;
            Ok(())
        })();
        written.map_err(|error| {
            let _ = nix::unistd::unlinkat(
                &*self.fd,
                temporary.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            format!("writing {}: {error}", path.display())
        })
    }

    /// Removes `session`'s files (it ended normally); missing ones are fine.
    /// A link planted at one of their names is removed, never followed.
    pub fn remove(&self, session: &str) {
        let names = [Self::record_name(session), Self::journal_name(session)];
        for name in names.into_iter().flatten() {
            if let Err(error) = nix::unistd::unlinkat(
                &*self.fd,
                name.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) && error != nix::errno::Errno::ENOENT
            {
                tracing::warn!(path = %self.dir.join(&name).display(), %error, "removing a session's state file");
            }
        }
    }

    /// A new, empty journal of `session`'s calls in flight (0600), in place
    /// of the one a reattach has read. Something other than box's journal at
    /// its name (a planted link) is refused and logged, never followed: the
    /// session then runs without a journal.
    pub fn journal(&self, session: &str) -> Option<Journal> {
        let name = Self::journal_name(session)?;
        let path = self.dir.join(&name);
        if let Some(what) = self.planted(&name) {
            tracing::warn!(path = %path.display(), "{what} is at the session's call journal, not box's file: refused, not followed; calls in flight at a restart will not be reported (remove it; someone who can write the state directory put it there)");
            return None;
        }
        match nix::unistd::unlinkat(
            &*self.fd,
            name.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "removing the session's old call journal; calls in flight at a restart will not be reported");
                return None;
            }
        }
        match self.create(&name) {
            Ok(file) => Some(Journal(file)),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "creating the session's call journal (refused if anything appeared at its name); calls in flight at a restart will not be reported");
                None
            }
        }
    }

    /// The text of `name` if it is a regular file of this user's, others
    /// unable to read or write it; else why not. Never through a link.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let fd = match nix::fcntl::openat(&*self.fd, name, READ, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(nix::errno::Errno::ELOOP) => {
                return Err("a symbolic link, not box's file: refused, not followed".to_owned());
            }
            Err(error) => return Err(error.to_string()),
        };
        let stat = nix::sys::stat::fstat(&fd).map_err(|error| error.to_string())?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!("{}, not box's file", kind_of(stat.st_mode)));
        }
        let uid = nix::unistd::geteuid().as_raw();
        if stat.st_uid != uid {
            return Err(format!(
                "owned by {}, not this user ({})",
                owner_name(stat.st_uid),
                owner_name(uid)
            ));
        }
        if stat.st_mode & 0o077 != 0 {
            return Err(format!(
                "mode {:o}: others may read or write it (box writes 0600)",
                stat.st_mode & 0o777
            ));
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut text)
            .map_err(|error| error.to_string())?;
        Ok(Some(text))
    }

    /// The calls `session`'s journal shows sent and never settled: those in
    /// flight when its host died, `{id, unit, method}` each (the client's
    /// id), in the order they were sent.
    pub fn unsettled(&self, session: &str, units: &[UnitRecord]) -> Vec<Value> {
        self.unsettled_calls(session, units)
            .into_iter()
            .map(|(_, _, call)| call)
            .collect()
    }

    /// [`Store::unsettled`], each with the unit's index and the call's id at
    /// the unit (where a late answer would come from). A journal that is not
    /// box's (a planted link) is logged and not read.
    pub fn unsettled_calls(&self, session: &str, units: &[UnitRecord]) -> Vec<(usize, u64, Value)> {
        let Some(name) = Self::journal_name(session) else {
            return Vec::new();
        };
        let text = match self.read(&name) {
            Ok(Some(text)) => String::from_utf8_lossy(&text).into_owned(),
            Ok(None) => return Vec::new(),
            Err(why) => {
                tracing::warn!(path = %self.dir.join(&name).display(), %why, "ignoring a session's call journal; the calls in flight at the restart are not reported");
                return Vec::new();
            }
        };
        let mut open: Vec<(u64, u64, Value)> = Vec::new();
        for line in text.lines() {
            // A line cut short by the host's death is no evidence of anything.
            let Ok(entry) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let at = |key: &str| {
                let pair = entry.get(key)?.as_array()?;
                Some((pair.first()?.as_u64()?, pair.get(1)?.as_u64()?))
            };
            if let Some((unit, unit_id)) = at("sent") {
                let name = usize::try_from(unit)
                    .ok()
                    .and_then(|index| units.get(index))
                    .map_or_else(String::new, |unit| unit.name.clone());
                open.push((
                    unit,
                    unit_id,
                    serde_json::json!({
                        "id": entry.get("id").cloned().unwrap_or(Value::Null),
                        "unit": name,
                        "method": entry.get("method").cloned().unwrap_or(Value::Null),
                    }),
                ));
            } else if let Some(done) = at("done") {
                open.retain(|(unit, unit_id, _)| (*unit, *unit_id) != done);
            }
        }
        open.into_iter()
            .filter_map(|(unit, unit_id, call)| Some((usize::try_from(unit).ok()?, unit_id, call)))
            .collect()
    }

    /// Every record that can be trusted; each other file is logged and
    /// skipped (left in place for whoever wants to look at it).
    pub fn load(&self) -> Vec<SessionRecord> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "reading the state directory");
                return Vec::new();
            }
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            let Some(session) = name.strip_suffix(".json") else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            match self.read_record(name, session) {
                Ok(record) => records.push(record),
                Err(why) => {
                    tracing::warn!(path = %self.dir.join(name).display(), %why, "ignoring a session state file");
                }
            }
        }
        records
    }

    fn read_record(&self, name: &str, session: &str) -> Result<SessionRecord, String> {
        let text = self
            .read(name)?
            .ok_or_else(|| "gone while the directory was read".to_owned())?;
        let version = serde_json::from_slice::<Value>(&text)
            .map_err(|error| format!("not valid JSON: {error}"))?
            .get("version")
            .and_then(Value::as_u64);
        if version != Some(u64::from(VERSION)) {
            return Err(format!(
                "version {version:?}, this box reads version {VERSION} only"
            ));
        }
        let record: SessionRecord = serde_json::from_slice(&text)
            .map_err(|error| format!("not a session record: {error}"))?;
        if record.session != session {
            return Err(format!(
                "names session `{}`, not the `{session}` of its file name",
                record.session
            ));
        }
        Ok(record)
    }
}

/// A session's journal of calls in flight: a line when a call is sent to a
/// unit (the client's id, the unit, its id there, the method; never the
/// arguments) and one when it settles, so a later host can tell a
/// reattached client which calls had an unknown outcome. Lines are written
/// without fsync: they must survive the host process's death, which the
/// page cache does, not the machine's.
#[derive(Debug)]
pub struct Journal(std::fs::File);

impl Journal {
    /// A call `unit_id` to unit `unit` for the client's `id`.
    pub fn sent(&self, unit: usize, unit_id: u64, id: &Value, method: &str) {
        self.line(&serde_json::json!({"sent": [unit, unit_id], "id": id, "method": method}));
    }

    /// Call `unit_id` to unit `unit` settled (answered, timed out,
    /// cancelled, its unit gone).
    pub fn done(&self, unit: usize, unit_id: u64) {
        self.line(&serde_json::json!({"done": [unit, unit_id]}));
    }

    fn line(&self, entry: &Value) {
        let mut line = entry.to_string().into_bytes();
        line.push(b'\n');
        // One write per line: appended whole or, at a crash, cut short.
        if let Err(error) = (&self.0).write_all(&line) {
            tracing::debug!(%error, "writing the session's call journal");
        }
    }
}

/// A persisted session whose units a starting host re-adopted (or failed
/// to), waiting for its client to reattach.
pub struct Adopted {
    /// What was persisted.
    pub record: SessionRecord,
    /// The session, re-adopted; or why it cannot be reattached (its units
    /// are left to their leases).
    pub units: Result<Reattached, String>,
}

/// A persisted session whose every unit was re-adopted.
pub struct Reattached {
    /// The plan, resolved again from the persisted profile and tightening.
    pub plan: Plan,
    /// The profile it was resolved from.
    pub profile: Profile,
    /// The units, in the plan's order (their leases renewed from now on).
    pub units: Vec<StartedUnit>,
    /// The egress units' proxies, served again in their socket directories
    /// (with the profile's list: a `box/network.set` narrowing is not kept).
    pub egress: Vec<crate::egress::EgressProxy>,
}

/// Let re-adopted units go without ending them: their renewals stop at once,
/// and their executors' input is held open until their leases have lapsed
/// (dropping it would close the executor's stdin and end the unit now), so
/// each unit ends by its lease, as a refused reattach promises.
pub fn leave_to_lease(units: Vec<StartedUnit>) {
    for unit in units {
        let StartedUnit {
            envelope,
            io,
            renewal,
            ended: _,
        } = unit;
        drop(renewal);
        let lease = envelope
            .lifecycle
            .map_or(Duration::from_secs(30), |lifecycle| {
                Duration::from_millis(lifecycle.lease_ms)
            });
        tokio::spawn(async move {
            tokio::time::sleep(lease * 2 + Duration::from_secs(5)).await;
            drop(io);
        });
    }
}

/// Sessions waiting to be reattached, by session id, and those whose units
/// are still being re-adopted (a reattach waits for them).
#[derive(Default)]
pub struct Reattachable {
    ready: Mutex<HashMap<String, Adopted>>,
    adopting: Mutex<std::collections::HashSet<String>>,
    settled: tokio::sync::Notify,
}

impl Reattachable {
    /// Adds `adopted` (its adoption has settled).
    pub fn insert(&self, adopted: Adopted) {
        let id = adopted.record.session.clone();
        if let Ok(mut map) = self.ready.lock() {
            map.insert(id.clone(), adopted);
        }
        self.settle(&id);
    }

    /// Marks `id` as being re-adopted.
    pub fn adopting(&self, id: &str) {
        if let Ok(mut set) = self.adopting.lock() {
            set.insert(id.to_owned());
        }
    }

    /// `id`'s adoption has settled (with an entry or without one).
    pub fn settle(&self, id: &str) {
        if let Ok(mut set) = self.adopting.lock() {
            set.remove(id);
        }
        self.settled.notify_waiters();
    }

    /// Waits until `id` is not being re-adopted any more.
    pub async fn settled(&self, id: &str) {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let waiting = self.adopting.lock().is_ok_and(|set| set.contains(id));
            if !waiting {
                return;
            }
            notified.await;
        }
    }

    /// Takes the session `id`'s entry.
    pub fn take(&self, id: &str) -> Option<Adopted> {
        self.ready.lock().ok()?.remove(id)
    }

    /// How many sessions wait.
    pub fn len(&self) -> usize {
        self.ready.lock().map(|map| map.len()).unwrap_or(0)
    }

    /// Takes every entry.
    pub fn take_all(&self) -> Vec<Adopted> {
        self.ready
            .lock()
            .map(|mut map| map.drain().map(|(_, adopted)| adopted).collect())
            .unwrap_or_default()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The dead hosts' instances this host holds because it re-adopted their
/// units (which keep their instance's label): each held while any of those
/// units' renewals runs ([`box_backend::Renewal::holding`]). One per host
/// (`Services::held_instances`), not per process: a second host in the
/// same process (tests) must claim a dead instance itself, never borrow the
/// first host's hold.
#[derive(Default)]
pub struct HeldInstances(
    Mutex<HashMap<String, std::sync::Weak<box_backend::instance::InstanceLock>>>,
);

/// Instance `id` held for re-adopted units: the hold this host already has,
/// or the dead instance's lock claimed now; `None` when its host is not
/// known dead (a live host's session is its own: binding its units' sockets
/// would take them from under it).
pub(crate) fn hold_instance(
    held: &HeldInstances,
    id: &str,
) -> Option<Arc<box_backend::instance::InstanceLock>> {
    use box_backend::instance::{InstanceLock, Liveness, default_dir, liveness};
    let mut held = held.0.lock().unwrap_or_else(|poison| poison.into_inner());
    if let Some(lock) = held.get(id).and_then(std::sync::Weak::upgrade) {
        return Some(lock);
    }
    let dir = default_dir();
    if liveness(&dir, id) != Liveness::Dead {
        return None;
    }
    // Claiming it is the check that it is still dead.
    match InstanceLock::adopt(&dir, id) {
        Ok(lock) => {
            let lock = Arc::new(lock);
            held.insert(id.to_owned(), Arc::downgrade(&lock));
            Some(lock)
        }
        Err(error) => {
            tracing::debug!(instance = id, %error, "a dead host's instance could not be held");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    fn record(session: &str) -> SessionRecord {
        SessionRecord {
            version: VERSION,
            session: session.to_owned(),
            instance: "i".to_owned(),
            secret_sha256: secret_digest("s"),
            profile: "default".to_owned(),
            tighten: Value::Null,
            plan_digest: "d".to_owned(),
            protocol_version: "2025-06-18".to_owned(),
            started_unix_ms: 0,
            initialize: serde_json::json!({}),
            units: Vec::new(),
        }
    }

    #[test]
    fn records_round_trip_with_private_modes_and_go_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        store.write(&record("abc")).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().mode() & 0o777;
        assert_eq!(mode(store.dir()), 0o700);
        assert_eq!(mode(&store.dir().join("abc.json")), 0o600);
        assert_eq!(store.load(), vec![record("abc")]);
        store.remove("abc");
        assert_eq!(store.load(), Vec::new());
    }

    #[test]
    fn corrupt_foreign_or_mismatched_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.write(&record("good")).unwrap();
        let write = |name: &str, text: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("bad.json", "{not json", 0o600);
        let mut other = serde_json::to_value(record("v2")).unwrap();
        other["version"] = serde_json::json!(2);
        write("v2.json", &other.to_string(), 0o600);
        write(
            "open.json",
            &serde_json::to_string(&record("open")).unwrap(),
            0o644,
        );
        write(
            "renamed.json",
            &serde_json::to_string(&record("else")).unwrap(),
            0o600,
        );
        assert_eq!(store.load(), vec![record("good")]);
    }

    #[test]
    fn the_journal_names_the_calls_never_settled() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let journal = store.journal("s").unwrap();
        journal.sent(0, 2, &serde_json::json!(7), "tools/call");
        journal.sent(0, 3, &serde_json::json!("b"), "agentworkspace/process.wait");
        journal.done(0, 2);
        let unit = UnitRecord {
            name: "workspace".to_owned(),
            backend: "docker".to_owned(),
            id: "c".to_owned(),
            identity: "i".to_owned(),
            image_id: String::new(),
            image_digest: None,
            run_dir: PathBuf::new(),
            envelope: Value::Null,
            tools: None,
            egress_dir: None,
        };
        // A line cut short at the host's death is skipped.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("s.calls"))
            .unwrap()
            .write_all(b"{\"done\": [0,")
            .unwrap();
        assert_eq!(
            store.unsettled("s", &[unit]),
            vec![
                serde_json::json!({"id": "b", "unit": "workspace", "method": "agentworkspace/process.wait"})
            ]
        );
        store.remove("s");
        assert!(!dir.path().join("s.calls").exists());
    }

    /// Issue 22, item 3: a state directory its group or every user may
    /// write, or another user's, is refused naming its path, mode and owner
    /// and what to do, and its mode is left as it was.
    #[test]
    fn a_state_directory_others_may_write_or_another_users_is_refused() {
        let me = nix::unistd::geteuid().as_raw();
        for (mode, says) in [
            (0o777, "lets its group and every user write it"),
            (0o770, "lets its group write it"),
            (0o703, "lets every user write it"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().join("state");
            std::fs::create_dir(&state).unwrap();
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).unwrap();
            let why = Store::open(&state).unwrap_err();
            assert!(why.contains(&state.display().to_string()), "{why}");
            assert!(why.contains(&format!("mode {mode:04o}")), "{why}");
            assert!(why.contains(says), "{why}");
            assert!(why.contains(&format!("uid {me}")), "the owner: {why}");
            assert!(why.contains("chmod 700"), "what to do: {why}");
            let now = std::fs::metadata(&state).unwrap().mode() & 0o7777;
            assert_eq!(now, mode, "the directory's mode was changed");
        }
        // Another user's directory, though only its owner may write it.
        let dir = tempfile::tempdir().unwrap();
        let state = if me == 0 {
            let state = dir.path().join("state");
            std::fs::create_dir(&state).unwrap();
            std::os::unix::fs::chown(&state, Some(54321), Some(54321)).unwrap();
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
            state
        } else {
            // Not root: the root directory is another user's.
            PathBuf::from("/")
        };
        let owner = std::fs::metadata(&state).unwrap().uid();
        let why = Store::open(&state).unwrap_err();
        assert!(why.contains(&format!("owned by uid {owner}")), "{why}");
        assert!(why.contains(&state.display().to_string()), "{why}");
        assert!(why.contains("use a directory of your own"), "{why}");
        // A directory box creates is 0700, its missing parents too.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("a/b");
        Store::open(&state).unwrap();
        for path in [dir.path().join("a"), state] {
            assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        }
    }

    /// Issue 22, item 3, from the attacker's side: links planted at a
    /// session's record, its journal and a record of no session, each
    /// pointing at a canary the host's user owns: nothing box does follows
    /// them (the canary is unchanged), each is refused and the journal's
    /// refusal is logged naming the path.
    #[test]
    fn links_planted_in_the_state_directory_are_refused_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let store = Store::open(&state).unwrap();
        let canary = dir.path().join("canary");
        std::fs::write(&canary, "canary\n").unwrap();
        std::fs::set_permissions(&canary, std::fs::Permissions::from_mode(0o600)).unwrap();
        for name in ["s.calls", "s.json", "t.json"] {
            std::os::unix::fs::symlink(&canary, state.join(name)).unwrap();
        }
        let fifo = state.join("f.json");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();

        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || LogWriter(writer.clone()))
            .finish();
        let journal = tracing::subscriber::with_default(subscriber, || {
            assert_eq!(store.unsettled("s", &[]), Vec::<Value>::new());
            // Loading does not hang on the FIFO and trusts none of them.
            assert_eq!(store.load(), Vec::new());
            store.journal("s")
        });
        assert!(journal.is_none(), "a journal through the link");
        let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
        for name in ["s.calls", "s.json", "t.json", "f.json"] {
            let path = state.join(name).display().to_string();
            assert!(logs.contains(&path), "{name} not reported: {logs}");
        }
        assert!(logs.contains("a symbolic link"), "{logs}");
        assert!(logs.contains("WARN"), "{logs}");

        let why = store.write(&record("s")).unwrap_err();
        assert!(why.contains("a symbolic link is there"), "{why}");
        assert!(
            why.contains(&state.join("s.json").display().to_string()),
            "{why}"
        );
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "canary\n");
        // The links are still links; nothing was written through them.
        for name in ["s.calls", "s.json"] {
            assert!(
                std::fs::symlink_metadata(state.join(name))
                    .unwrap()
                    .is_symlink()
            );
        }
        // A session that ends removes the links, never what they point at.
        store.remove("s");
        assert!(!state.join("s.calls").exists() && !state.join("s.json").exists());
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "canary\n");
        // Then the session's files are box's again.
        store.write(&record("s")).unwrap();
        assert!(store.journal("s").is_some());
        let mode = |name: &str| std::fs::metadata(state.join(name)).unwrap().mode() & 0o777;
        assert_eq!((mode("s.json"), mode("s.calls")), (0o600, 0o600));
    }

    /// Log lines into a shared buffer.
    struct LogWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for LogWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Records written before egress units were reattached (no `egressDir`)
    /// still load; the field is written only when there is one.
    #[test]
    fn unit_records_without_an_egress_directory_still_load() {
        let old = serde_json::json!({"name": "workspace", "backend": "docker", "id": "c",
            "identity": "i", "imageId": "", "imageDigest": null, "runDir": "/r",
            "envelope": null, "tools": null});
        let unit: UnitRecord = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(unit.egress_dir, None);
        assert_eq!(serde_json::to_value(&unit).unwrap(), old);
        let mut with = old;
        with["egressDir"] = serde_json::json!("/run/box/egress/x");
        let unit: UnitRecord = serde_json::from_value(with).unwrap();
        assert_eq!(unit.egress_dir, Some(PathBuf::from("/run/box/egress/x")));
    }

    #[test]
    fn secrets_are_128_bits_and_compared_by_digest() {
        let (secret, digest) = new_secret();
        assert_eq!(secret.len(), 32);
        assert!(secret_matches(&secret, &digest));
        assert!(!secret_matches("wrong", &digest));
        assert!(!file_safe("../x") && file_safe("ab-12_C"));
    }
}
