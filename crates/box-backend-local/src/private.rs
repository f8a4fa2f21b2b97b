//! The host's root-only system files: what a unit that is the host's uid 0
//! must not read (`/etc/shadow`, `/etc/ssl/private`, `/etc/docker/key.json`),
//! found by a walk of the system directories units read, and remembered
//! across processes in a cache file that is checked before every use.
//!
//! Why a cache: every stdio `box serve` and every `box run` is a new process,
//! and the walk (some 1,200 entries of `/etc` and `/opt`, a `statx` each) was
//! the largest part of a local session's start that was not the sandbox itself.
//!
//! Why it can be trusted: the cache records the identity and change time
//! (device, inode, ctime) of every directory the walk read and every entry it
//! judged. Changing an entry's mode, owner or contents changes its ctime;
//! adding, removing or renaming an entry changes its directory's. So the
//! cache is used only when every recorded entry is still exactly as it was
//! (about a third of the walk's system calls, and no directory reads);
//! otherwise the walk is done again. It is not used either when it is
//! missing or unreadable, is not a regular file of the caller's own that only
//! the caller may read or write, names other roots, is older than a day or
//! from the future, or was recorded while an entry had just changed: file
//! times come from a coarse clock, so a change within the same tick as the
//! one recorded would look like none (such a walk is simply not stored).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The system directories searched: those a unit reads that hold
/// configuration (`/usr` and the libraries are left out: large, and not where
/// secrets are kept).
pub(super) const ROOTS: &[&str] = &["/etc", "/opt"];

/// An entry changed this recently when the walk began is not trusted to show
/// its next change in its ctime (coarse timestamps), so such a walk is not stored.
pub(super) const SETTLE: Duration = Duration::from_secs(2);

/// The oldest cache used, whatever it records.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The largest cache file read.
const MAX_CACHE_BYTES: u64 = 4 << 20;

/// The first line of a cache file: its format.
const MAGIC: &str = "box root-only files v1";

/// What one entry was when the walk judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
            ctime: metadata.ctime(),
            ctime_nsec: metadata.ctime_nsec(),
        }
    }

    fn changed_since(&self, instant: SystemTime) -> bool {
        let Ok(since) = instant.duration_since(SystemTime::UNIX_EPOCH) else {
            return true;
        };
        let ctime = Duration::new(
            u64::try_from(self.ctime).unwrap_or(0),
            u32::try_from(self.ctime_nsec).unwrap_or(0),
        );
        ctime >= since
    }
}

/// One walk: the root-only entries found, and every entry it judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Walk {
    roots: Vec<PathBuf>,
    /// When the walk began.
    began: SystemTime,
    /// Every directory read and every entry judged (the found ones too).
    judged: Vec<(PathBuf, Stamp)>,
    /// Root-only entries, sorted: a directory is listed whole, not its contents.
    found: Vec<PathBuf>,
}

impl Walk {
    /// The root-only entries.
    pub(super) fn found(&self) -> &[PathBuf] {
        &self.found
    }

    /// Whether every entry the walk judged is still exactly as it was.
    pub(super) fn is_current(&self) -> bool {
        self.judged.iter().all(|(path, stamp)| {
            std::fs::symlink_metadata(path).is_ok_and(|metadata| Stamp::of(&metadata) == *stamp)
        })
    }
}

/// Walk `roots` for entries others may not read (a directory: not read or
/// search), without following symbolic links. A directory that cannot be
/// read ends the walk of that directory only.
pub(super) fn walk(roots: &[PathBuf]) -> Walk {
    let began = SystemTime::now();
    let mut judged = Vec::new();
    let mut found = Vec::new();
    let mut pending = Vec::new();
    for root in roots {
        if let Ok(metadata) = std::fs::symlink_metadata(root)
            && metadata.is_dir()
        {
            pending.push((root.clone(), Stamp::of(&metadata)));
        }
    }
    while let Some((dir, stamp)) = pending.pop() {
        // The directory's stamp is taken before it is read: an entry added
        // while it is read changes it after, which the next check sees.
        judged.push((dir.clone(), stamp));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            // The kind comes with the listing; links are neither followed
            // nor covered, so they cost no `statx`.
            if entry.file_type().is_ok_and(|kind| kind.is_symlink()) {
                continue;
            }
            // Relative to the open directory (`fstatat`), never following a link.
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if metadata.file_type().is_symlink() {
                continue;
            }
            let mode = metadata.permissions().mode();
            let path = entry.path();
            if metadata.is_dir() {
                if mode & 0o005 != 0o005 {
                    judged.push((path.clone(), Stamp::of(&metadata)));
                    found.push(path);
                } else {
                    pending.push((path, Stamp::of(&metadata)));
                }
            } else {
                if mode & 0o004 == 0 {
                    found.push(path.clone());
                }
                judged.push((path, Stamp::of(&metadata)));
            }
        }
    }
    found.sort();
    Walk {
        roots: roots.to_vec(),
        began,
        judged,
        found,
    }
}

/// The root-only entries under `roots`: from the cache at `cache` when it is
/// still true, else by a walk, stored there for the next process.
pub(super) fn root_only_entries(roots: &[PathBuf], cache: Option<&Path>) -> Walk {
    if let Some(cache) = cache
        && let Some(walk) = load(cache, roots, SystemTime::now())
        && walk.is_current()
    {
        return walk;
    }
    let walk = walk(roots);
    if let Some(cache) = cache
        && let Err(error) = store(cache, &walk, SETTLE)
    {
        tracing::debug!(path = %cache.display(), %error, "the root-only file list was not cached");
    }
    walk
}

/// Where the cache lives for this (root) process: its runtime directory,
/// `$XDG_RUNTIME_DIR/box` when set, else `/run/box`; `None` when neither is
/// usable (then every process walks).
pub(super) fn cache_path() -> Option<PathBuf> {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .map_or_else(|| PathBuf::from("/run/box"), |dir| dir.join("box"));
    use std::os::unix::fs::DirBuilderExt;
    let made = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    match made {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    is_private_dir(&dir).then(|| dir.join("root-only-files"))
}

/// A directory of the caller's own that nobody else may write to.
fn is_private_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|metadata| {
        metadata.is_dir()
            && metadata.uid() == nix::unistd::geteuid().as_raw()
            && metadata.mode() & 0o022 == 0
    })
}

/// Read a cache (not yet checked against the file system: see
/// [`Walk::is_current`]). `None` when it cannot be trusted to be what this
/// process would have written.
fn load(path: &Path, roots: &[PathBuf], now: SystemTime) -> Option<Walk> {
    let parent = path.parent()?;
    if !is_private_dir(parent) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file()
        || metadata.uid() != nix::unistd::geteuid().as_raw()
        || metadata.mode() & 0o077 != 0
    {
        return None;
    }
    let mut text = Vec::new();
    file.take(MAX_CACHE_BYTES).read_to_end(&mut text).ok()?;
    let walk = parse(&text)?;
    let age = now.duration_since(walk.began).ok()?;
    (walk.roots == roots && age <= MAX_AGE).then_some(walk)
}

/// Write `walk` to `path` (atomically, mode 0600), unless an entry it judged
/// had changed within `settle` of the walk's start.
fn store(path: &Path, walk: &Walk, settle: Duration) -> std::io::Result<()> {
    let recent = walk
        .began
        .checked_sub(settle)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if walk
        .judged
        .iter()
        .any(|(_, stamp)| stamp.changed_since(recent))
    {
        return Err(std::io::Error::other(
            "an entry changed just before the walk; not cached",
        ));
    }
    let text = render(walk)
        .ok_or_else(|| std::io::Error::other("a path holds a line break; not cached"))?;
    let temporary = path.with_extension(format!("{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temporary)?;
    let written = file
        .write_all(&text)
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// The cache's text: the format line, the walk's start, then `root PATH`,
/// `entry DEV INO CTIME NSEC PATH` and `found PATH` lines (paths as bytes, to
/// the end of the line). `None` if a path holds a line break.
fn render(walk: &Walk) -> Option<Vec<u8>> {
    let began = walk
        .began
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut text = format!(
        "{MAGIC}\nbegan {} {}\n",
        began.as_secs(),
        began.subsec_nanos()
    )
    .into_bytes();
    let mut line = |head: String, path: &Path| -> Option<()> {
        let bytes = path.as_os_str().as_bytes();
        if bytes.contains(&b'\n') {
            return None;
        }
        text.extend_from_slice(head.as_bytes());
        text.extend_from_slice(bytes);
        text.push(b'\n');
        Some(())
    };
    for root in &walk.roots {
        line("root ".to_owned(), root)?;
    }
    for (path, stamp) in &walk.judged {
        line(
            format!(
                "entry {} {} {} {} ",
                stamp.dev, stamp.ino, stamp.ctime, stamp.ctime_nsec
            ),
            path,
        )?;
    }
    for path in &walk.found {
        line("found ".to_owned(), path)?;
    }
    Some(text)
}

fn parse(text: &[u8]) -> Option<Walk> {
    let mut lines = text.split(|byte| *byte == b'\n');
    if lines.next()? != MAGIC.as_bytes() {
        return None;
    }
    let began = {
        let line = std::str::from_utf8(lines.next()?).ok()?;
        let mut words = line.strip_prefix("began ")?.split(' ');
        let seconds: u64 = words.next()?.parse().ok()?;
        let nanos: u32 = words.next()?.parse().ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))?
    };
    let mut walk = Walk {
        roots: Vec::new(),
        began,
        judged: Vec::new(),
        found: Vec::new(),
    };
    let path_of = |bytes: &[u8]| PathBuf::from(OsStr::from_bytes(bytes));
    for line in lines {
        if line.is_empty() {
            continue;
        }
        if let Some(path) = line.strip_prefix(b"root ") {
            walk.roots.push(path_of(path));
        } else if let Some(path) = line.strip_prefix(b"found ") {
            walk.found.push(path_of(path));
        } else if let Some(rest) = line.strip_prefix(b"entry ") {
            let mut fields = rest.splitn(5, |byte| *byte == b' ');
            let mut number = || -> Option<&[u8]> { fields.next() };
            let field = |bytes: Option<&[u8]>| -> Option<i128> {
                std::str::from_utf8(bytes?).ok()?.parse().ok()
            };
            let stamp = Stamp {
                dev: u64::try_from(field(number())?).ok()?,
                ino: u64::try_from(field(number())?).ok()?,
                ctime: i64::try_from(field(number())?).ok()?,
                ctime_nsec: i64::try_from(field(number())?).ok()?,
            };
            walk.judged.push((path_of(number()?), stamp));
        } else {
            return None;
        }
    }
    Some(walk)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use pretty_assertions::assert_eq;

    use super::*;

    /// Long enough for file times (a coarse clock) to move on.
    fn tick() {
        std::thread::sleep(Duration::from_millis(30));
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A tree with a root-only file, a root-only directory, public files, a
    /// public directory and a link to a root-only file; and a private cache
    /// directory beside it.
    fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("etc");
        std::fs::create_dir_all(root.join("ssl/private")).unwrap();
        std::fs::create_dir_all(root.join("public")).unwrap();
        std::fs::write(root.join("shadow"), "secret").unwrap();
        chmod(&root.join("shadow"), 0o640);
        chmod(&root.join("ssl/private"), 0o700);
        std::fs::write(root.join("passwd"), "public").unwrap();
        std::fs::write(root.join("public/conf"), "public").unwrap();
        std::os::unix::fs::symlink(root.join("shadow"), root.join("link")).unwrap();
        let cache_dir = dir.path().join("cache");
        std::fs::create_dir(&cache_dir).unwrap();
        chmod(&cache_dir, 0o700);
        let cache = cache_dir.join("root-only-files");
        (dir, root, cache)
    }

    #[test]
    fn the_walk_finds_root_only_entries_and_follows_no_link() {
        let (_dir, root, _) = fixture();
        let walk = walk(std::slice::from_ref(&root));
        assert_eq!(
            walk.found(),
            [root.join("shadow"), root.join("ssl/private")]
        );
        assert!(walk.is_current());
    }

    #[test]
    fn a_stored_walk_is_used_while_nothing_changed() {
        let (_dir, root, cache) = fixture();
        let roots = vec![root.clone()];
        tick();
        let walked = walk(&roots);
        store(&cache, &walked, Duration::ZERO).unwrap();
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let loaded = load(&cache, &roots, SystemTime::now()).unwrap();
        assert_eq!(loaded, walked);
        assert!(loaded.is_current());
        assert_eq!(
            root_only_entries(&roots, Some(&cache)).found(),
            walked.found()
        );
    }

    /// Every change that could make another entry root-only, or this list
    /// wrong, is seen: a mode narrowed in place, an entry added, removed or
    /// renamed, a directory closed.
    #[test]
    fn any_change_beneath_the_roots_makes_the_cache_stale() {
        type Change = fn(&Path);
        let changes: [(&str, Change); 6] = [
            ("a public file made root-only in place", |root| {
                chmod(&root.join("passwd"), 0o600);
            }),
            ("a root-only file added", |root| {
                let path = root.join("public/key");
                std::fs::write(&path, "k").unwrap();
                chmod(&path, 0o600);
            }),
            ("a file removed", |root| {
                std::fs::remove_file(root.join("public/conf")).unwrap();
            }),
            ("a file renamed over another", |root| {
                std::fs::rename(root.join("shadow"), root.join("passwd")).unwrap();
            }),
            ("a public directory closed", |root| {
                chmod(&root.join("public"), 0o700);
            }),
            ("a link replaced by a file", |root| {
                std::fs::remove_file(root.join("link")).unwrap();
                std::fs::write(root.join("link"), "now a file").unwrap();
            }),
        ];
        for (what, change) in changes {
            let (_dir, root, cache) = fixture();
            let roots = vec![root.clone()];
            tick();
            store(&cache, &walk(&roots), Duration::ZERO).unwrap();
            tick();
            change(&root);
            let loaded = load(&cache, &roots, SystemTime::now()).unwrap();
            assert!(!loaded.is_current(), "{what}: still taken as current");
            // The next start walks again and finds what is root-only now.
            let fresh = root_only_entries(&roots, Some(&cache));
            assert_eq!(fresh.found(), walk(&roots).found(), "{what}");
        }
    }

    #[test]
    fn a_cache_that_cannot_be_trusted_is_not_used() {
        let (_dir, root, cache) = fixture();
        let roots = vec![root.clone()];
        tick();
        let walked = walk(&roots);
        store(&cache, &walked, Duration::ZERO).unwrap();
        let now = SystemTime::now();
        // Other roots, too old, from the future.
        assert_eq!(load(&cache, &[root.join("public")], now), None);
        assert_eq!(
            load(&cache, &roots, now + MAX_AGE + Duration::from_secs(60)),
            None
        );
        assert_eq!(
            load(&cache, &roots, walked.began - Duration::from_secs(60)),
            None
        );
        // Readable or writable by others.
        chmod(&cache, 0o644);
        assert_eq!(load(&cache, &roots, now), None);
        chmod(&cache, 0o600);
        assert!(load(&cache, &roots, now).is_some());
        // A directory others may write to.
        let cache_dir = cache.parent().unwrap();
        chmod(cache_dir, 0o777);
        assert_eq!(load(&cache, &roots, now), None);
        chmod(cache_dir, 0o700);
        // A link in place of the file.
        let elsewhere = cache_dir.join("elsewhere");
        std::fs::rename(&cache, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cache).unwrap();
        assert_eq!(load(&cache, &roots, now), None);
        std::fs::remove_file(&cache).unwrap();
        // Missing, or not a cache at all.
        assert_eq!(load(&cache, &roots, now), None);
        for garbage in ["", "hello\n", "box root-only files v1\nbegan x 0\n"] {
            std::fs::write(&cache, garbage).unwrap();
            chmod(&cache, 0o600);
            assert_eq!(load(&cache, &roots, now), None, "{garbage:?}");
        }
    }

    #[test]
    fn a_walk_over_entries_that_just_changed_is_not_stored() {
        let (_dir, root, cache) = fixture();
        let walked = walk(std::slice::from_ref(&root));
        assert!(store(&cache, &walked, SETTLE).is_err());
        assert!(!cache.exists());
    }

    #[test]
    fn a_cache_renders_and_parses_back_whole() {
        let (_dir, root, _) = fixture();
        std::fs::write(root.join("odd name \u{e9}"), "x").unwrap();
        let walked = walk(std::slice::from_ref(&root));
        assert_eq!(parse(&render(&walked).unwrap()), Some(walked));
    }
}
