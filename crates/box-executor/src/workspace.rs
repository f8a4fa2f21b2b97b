//! The confined workspace: every path a tool names resolves beneath the root,
//! and a link never leads out (cap-std's `Dir`, openat2 RESOLVE_BENEATH).
//!
//! Names are cleaned lexically first (Go's `filepath.Clean`): a name that
//! climbs out or is absolute outside the root is refused before any I/O. Every
//! I/O then goes through one `Dir` opened on the root, so a link that leads out
//! (or a `..` that a link would make climb out) fails in the kernel. FIFOs and
//! devices are opened non-blocking and refused as "not a regular file".
//!
//! Names are bytes ([`Name`]): a file name need not be UTF-8. A tool's path
//! argument may spell a name in the quoted form tool output shows
//! (`names`); a bash word is always literal. A name shows itself quoted where
//! it must be (`Display`), so every message that prints one is escaped.
//!
//! The workspace also owns the state the file tools share across calls: the
//! write lock and the read ledger behind version-aware writes (seed 003).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use cap_std::fs::{Dir, File, Metadata, OpenOptions, OpenOptionsExt};
use sha2::{Digest, Sha256};

use super::facts::{FactCall, LINKS_UNKNOWN, SENTINEL};
use super::names;

/// The longest path the kernel takes (`PATH_MAX`), in bytes.
const PATH_MAX: usize = 4096;
/// The longest name of one path component (`NAME_MAX`), in bytes.
const NAME_MAX: usize = 255;

/// A cleaned root-relative name (`.` for the root), as bytes. Displayed as
/// tool output shows a path (`names::show_path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Name(PathBuf);

impl Name {
    /// Whether this names the root itself.
    pub fn is_root(&self) -> bool {
        self.0 == Path::new(".")
    }

    /// The name as a path relative to the root.
    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// The name as a facts claim carries it: itself when it is UTF-8 (JSON
    /// escapes the rest), else with U+FFFD for each byte that is not, so a
    /// policy's path rules still match the names around it.
    pub fn to_facts(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&names::show_path(&self.0))
    }
}

impl AsRef<Path> for Name {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

/// Why a path cannot be used.
#[derive(Debug, thiserror::Error)]
#[allow(
    dead_code,
    reason = "`Io` is built by `directory`, which the process work calls"
)]
pub(crate) enum PathError {
    /// Absolute outside the root, or climbing out of it (the path as shown).
    #[error("path is outside the workspace: {0}")]
    Outside(String),
    /// NUL bytes, over-long, a broken quoted name, or otherwise not a name.
    #[error("invalid path: {0}")]
    Invalid(String),
    /// The file system said no.
    #[error("{path}: {source}")]
    Io {
        /// The path as the caller wrote it.
        path: String,
        /// What the file system said.
        source: std::io::Error,
    },
}

impl PathError {
    /// The I/O error for `path`, turned into `Outside` when cap-std refused
    /// because a link (or `..` through one) leads out of the root.
    #[allow(dead_code, reason = "used by `directory`")]
    pub fn io(path: &str, source: std::io::Error) -> Self {
        if is_escape(&source) {
            Self::Outside(path.to_owned())
        } else {
            Self::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// Whether `error` is cap-std's refusal of a path that leads out of its `Dir`.
pub(crate) fn is_escape(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::PermissionDenied
        && error.to_string().contains("outside of the filesystem")
}

/// What a file was when this executor last read it (or wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    /// The file's identity (device, inode): whichever name reached it.
    file: (u64, u64),
    size: u64,
    modified_nanos: i128,
    hash: [u8; 32],
}

/// The workspace root, opened once.
#[derive(Debug)]
pub(crate) struct Workspace {
    root: PathBuf,
    /// The root as the kernel names it (links in the root's own path resolved),
    /// so an absolute path written either way is recognised as inside.
    canonical_root: PathBuf,
    dir: Dir,
    /// One lock across every write and every edit's read-modify-write; a
    /// std mutex because it is taken on blocking threads, never across `.await`.
    writes: Mutex<()>,
    /// File identity → its version at this executor's last read or write.
    /// Keyed by inode, not name, so every link to a file is the same file and
    /// recording a read costs no path resolution.
    ledger: Mutex<HashMap<(u64, u64), Version>>,
    /// Whether overwriting or editing an existing file needs an earlier read.
    write_guard: bool,
}

impl Workspace {
    /// Open the root (it must exist and be a directory).
    pub fn open(root: &Path) -> std::io::Result<Self> {
        let root = std::path::absolute(root)?;
        let canonical_root = std::fs::canonicalize(&root)?;
        let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority())?;
        Ok(Self {
            root: clean_absolute(&root),
            canonical_root,
            dir,
            writes: Mutex::new(()),
            ledger: Mutex::new(HashMap::new()),
            write_guard: true,
        })
    }

    /// Turn the read-before-write rule on or off (`--write-guard`).
    pub fn with_write_guard(mut self, on: bool) -> Self {
        self.write_guard = on;
        self
    }

    /// The root, absolute, as processes in the unit see it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root directory handle every confined operation goes through.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The lock held across each write and each edit.
    pub fn lock_writes(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic under the lock leaves no state behind it to repair.
        self.writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The root-relative cleaned name of a tool's path argument `raw`
    /// (relative to the root, or absolute inside it; quoted names decoded);
    /// refused when it is not a usable name or lies outside. No I/O.
    pub fn name(&self, raw: &str) -> Result<Name, PathError> {
        let bytes = names::parse(raw).map_err(|why| {
            PathError::Invalid(format!("{}: {why}", names::show_path_bytes(raw.as_bytes())))
        })?;
        let shown = names::show_path_bytes(&bytes);
        self.clean("", &bytes, &shown)
    }

    /// The root-relative cleaned name of a bash word `word` (literal: bash
    /// has removed its quotes), resolved against the root-relative directory
    /// `base`. No I/O.
    pub fn word_name(&self, base: &str, word: &str) -> Result<Name, PathError> {
        self.clean(
            base,
            word.as_bytes(),
            &names::show_path_bytes(word.as_bytes()),
        )
    }

    /// `bytes` cleaned beneath the root (against `base` when relative);
    /// `shown` is how errors name it.
    fn clean(&self, base: &str, bytes: &[u8], shown: &str) -> Result<Name, PathError> {
        check_raw(bytes, shown)?;
        let path = Path::new(OsStr::from_bytes(bytes));
        if path.is_absolute() {
            let cleaned = clean_absolute(path);
            for root in [&self.root, &self.canonical_root] {
                if let Ok(rest) = cleaned.strip_prefix(root) {
                    return relative_name(rest, shown);
                }
            }
            return Err(PathError::Outside(shown.to_owned()));
        }
        let joined = if base.is_empty() || base == "." {
            path.to_path_buf()
        } else {
            Path::new(base).join(path)
        };
        relative_name(&joined, shown)
    }

    /// The facts calls for a tool's path argument `raw` claimed as `tool`: the
    /// root-relative cleaned name; a second call when links lead to another
    /// name inside; the sentinel form when it is outside or leads out; a
    /// `dax:links-unknown` call when where links lead cannot be read. The
    /// question text shows the path escaped.
    pub fn path_facts(&self, raw: &str, tool: &str) -> Vec<FactCall> {
        let shown = match names::parse(raw) {
            Ok(bytes) => names::show_path_bytes(&bytes).into_owned(),
            Err(_) => names::show_path_bytes(raw.as_bytes()).into_owned(),
        };
        self.facts_for(self.name(raw), raw, &shown, tool)
    }

    /// [`Workspace::path_facts`] for a bash word (literal), relative to the
    /// root-relative directory `base`.
    pub fn word_facts(&self, base: &str, word: &str, tool: &str) -> Vec<FactCall> {
        let shown = names::show_path_bytes(word.as_bytes());
        self.facts_for(self.word_name(base, word), word, &shown, tool)
    }

    fn facts_for(
        &self,
        name: Result<Name, PathError>,
        raw: &str,
        shown: &str,
        tool: &str,
    ) -> Vec<FactCall> {
        let call = |path: String, text: String, tool: &str| {
            let mut args = serde_json::Map::new();
            args.insert("path".to_owned(), serde_json::Value::String(path));
            FactCall {
                tool: tool.to_owned(),
                args,
                text,
            }
        };
        let name = match name {
            Ok(name) => name,
            Err(_) => return vec![call(format!("{SENTINEL}{raw}"), shown.to_owned(), tool)],
        };
        let mut calls = vec![call(name.to_facts(), shown.to_owned(), tool)];
        match self.resolve_links(name.as_path()) {
            Ok(target) if target == name => {}
            Ok(target) => calls.push(call(
                target.to_facts(),
                format!("{shown} -> {target}"),
                tool,
            )),
            Err(error) if is_escape(&error) => calls.push(call(
                format!("{SENTINEL}{raw}"),
                format!("{shown} -> outside the workspace"),
                tool,
            )),
            Err(_) => calls.push(call(
                name.to_facts(),
                format!("{shown} (where its links lead cannot be read)"),
                LINKS_UNKNOWN,
            )),
        }
        calls
    }

    /// The name `name` leads to with every link followed beneath the root: the
    /// longest existing prefix canonicalised, the rest appended. An error that
    /// [`is_escape`] when a link leads out.
    pub fn resolve_links(&self, name: &Path) -> std::io::Result<Name> {
        let path = name;
        let mut existing = path;
        let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
        loop {
            if existing.as_os_str().is_empty() || existing == Path::new(".") {
                break;
            }
            match self.dir.symlink_metadata(existing) {
                Ok(_) => break,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    if let Some(file_name) = existing.file_name() {
                        rest.push(file_name);
                    }
                    existing = existing.parent().unwrap_or(Path::new(""));
                }
                Err(error) => return Err(error),
            }
        }
        let mut resolved = if existing.as_os_str().is_empty() || existing == Path::new(".") {
            PathBuf::new()
        } else {
            self.dir.canonicalize(existing)?
        };
        for part in rest.iter().rev() {
            resolved.push(part);
        }
        Ok(name_of(resolved))
    }

    /// The absolute path of a directory inside the workspace named by `raw`
    /// (relative to the root, or absolute inside it), checked through the root.
    #[allow(
        dead_code,
        reason = "the bash and process work calls it (their stubs do not yet)"
    )]
    pub fn directory(&self, raw: &str) -> Result<PathBuf, PathError> {
        let name = self.name(raw)?;
        let shown = name.to_string();
        let metadata = self.metadata(&name).map_err(|e| PathError::io(&shown, e))?;
        if !metadata.is_dir() {
            return Err(PathError::Io {
                path: shown,
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        let resolved = self
            .resolve_links(name.as_path())
            .map_err(|e| PathError::io(&shown, e))?;
        Ok(if resolved.is_root() {
            self.root.clone()
        } else {
            self.root.join(resolved.as_path())
        })
    }

    /// Metadata of `name`, links followed beneath the root.
    pub fn metadata(&self, name: impl AsRef<Path>) -> std::io::Result<Metadata> {
        let name = name.as_ref();
        if name == Path::new(".") {
            self.dir.dir_metadata()
        } else {
            self.dir.metadata(name)
        }
    }

    /// Metadata of `name` itself (a link is described, not followed).
    pub fn symlink_metadata(&self, name: impl AsRef<Path>) -> std::io::Result<Metadata> {
        let name = name.as_ref();
        if name == Path::new(".") {
            self.dir.dir_metadata()
        } else {
            self.dir.symlink_metadata(name)
        }
    }

    /// Open the directory `name` beneath the root.
    pub fn open_dir(&self, name: impl AsRef<Path>) -> std::io::Result<Dir> {
        let name = name.as_ref();
        if name == Path::new(".") {
            self.dir.try_clone()
        } else {
            self.dir.open_dir(name)
        }
    }

    /// Open `name` for reading without ever blocking on a FIFO or device:
    /// non-blocking open, then refuse anything but a regular file.
    pub fn open_regular(&self, name: impl AsRef<Path>) -> Result<(File, Metadata), FileError> {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
        let file = self
            .dir
            .open_with(name.as_ref(), &options)
            .map_err(FileError::Io)?;
        let metadata = file.metadata().map_err(FileError::Io)?;
        if metadata.is_dir() {
            return Err(FileError::Directory);
        }
        if !metadata.is_file() {
            return Err(FileError::NotRegular);
        }
        Ok((file, metadata))
    }

    /// The version of the file `name` now: its size, modification time and the
    /// hash of its first `max_bytes` bytes (what a read scans).
    pub fn version(&self, name: impl AsRef<Path>, max_bytes: u64) -> Result<Version, FileError> {
        let (file, metadata) = self.open_regular(name)?;
        let mut hasher = Sha256::new();
        let mut reader = std::io::BufReader::new(file).take(max_bytes);
        let mut buffer = [0u8; 64 * 1024];
        loop {
            let read = reader.read(&mut buffer).map_err(FileError::Io)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        Ok(version_of(&metadata, hasher.finalize().into()))
    }

    /// Remember that this executor has seen a file as `version`.
    pub fn record(&self, version: Version) {
        if let Ok(mut ledger) = self.ledger.lock() {
            ledger.insert(version.file, version);
        }
    }

    /// Whether overwriting the existing file `name` (shown as `shown`) is
    /// allowed: it was read before and has not changed since. Call under the
    /// write lock.
    pub fn check_unchanged(&self, name: &Name, max_bytes: u64) -> Result<(), String> {
        if !self.write_guard {
            return Ok(());
        }
        let shown = name;
        let now = self
            .version(name, max_bytes)
            .map_err(|e| e.message(shown))?;
        let seen = self
            .ledger
            .lock()
            .ok()
            .and_then(|l| l.get(&now.file).cloned());
        let Some(seen) = seen else {
            return Err(format!(
                "{shown} already exists and has not been read in this session (or was replaced since it was read); read it first, then write or edit it"
            ));
        };
        if now != seen {
            return Err(format!(
                "{shown} changed since it was last read (by something else); read it again before writing or editing it"
            ));
        }
        Ok(())
    }
}

/// Why a file could not be opened as a regular file.
#[derive(Debug)]
pub(crate) enum FileError {
    /// A directory.
    Directory,
    /// A FIFO, socket or device.
    NotRegular,
    /// The file system said no.
    Io(std::io::Error),
}

impl FileError {
    /// The message for the file shown as `shown`.
    pub fn message(&self, shown: impl std::fmt::Display) -> String {
        match self {
            Self::Directory => format!("{shown} is a directory"),
            Self::NotRegular => format!("{shown}: not a regular file"),
            Self::Io(error) => io_message(shown, error),
        }
    }
}

/// The message for an I/O error on the path shown as `shown`.
pub(crate) fn io_message(shown: impl std::fmt::Display, error: &std::io::Error) -> String {
    if is_escape(error) {
        return PathError::Outside(shown.to_string()).to_string();
    }
    match error.kind() {
        std::io::ErrorKind::NotFound => format!("{shown}: no such file or directory"),
        std::io::ErrorKind::PermissionDenied => format!("{shown}: permission denied"),
        _ => format!("{shown}: {error}"),
    }
}

/// The version of a file with `metadata` whose scanned bytes hash to `hash`.
pub(crate) fn version_of(metadata: &Metadata, hash: [u8; 32]) -> Version {
    use cap_std::fs::MetadataExt;
    let modified_nanos =
        i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec());
    Version {
        file: (metadata.dev(), metadata.ino()),
        size: metadata.len(),
        modified_nanos,
        hash,
    }
}

/// The SHA-256 of `bytes`.
pub(crate) fn hash(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Refuse NUL bytes and names longer than the kernel takes (`shown` is how
/// the error names the path).
fn check_raw(bytes: &[u8], shown: &str) -> Result<(), PathError> {
    if bytes.contains(&0) {
        return Err(PathError::Invalid(shown.replace("\\x00", "\\0")));
    }
    if bytes.len() > PATH_MAX {
        return Err(PathError::Invalid(format!(
            "{}... ({} bytes; at most {PATH_MAX})",
            shown.chars().take(64).collect::<String>(),
            bytes.len()
        )));
    }
    if let Some(long) = bytes
        .split(|byte| *byte == b'/')
        .find(|part| part.len() > NAME_MAX)
    {
        return Err(PathError::Invalid(format!(
            "a component of {} bytes (at most {NAME_MAX}): {}...",
            long.len(),
            names::show(long).chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// The cleaned root-relative name of the relative path `path`, or `Outside`
/// (naming it as `shown`) when its `..` climb above the root.
fn relative_name(path: &Path, shown: &str) -> Result<Name, PathError> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(PathError::Outside(shown.to_owned()));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(PathError::Outside(shown.to_owned()));
            }
        }
    }
    Ok(name_of(parts.iter().collect()))
}

/// `path` as a [`Name`], `.` when empty.
fn name_of(path: PathBuf) -> Name {
    if path.as_os_str().is_empty() {
        Name(PathBuf::from("."))
    } else {
        Name(path)
    }
}

/// An absolute path with `.` and `..` removed lexically (`..` at `/` stays `/`).
fn clean_absolute(path: &Path) -> PathBuf {
    let mut cleaned = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => cleaned.push(part),
            Component::ParentDir => {
                cleaned.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    cleaned
}

#[cfg(test)]
mod tests;
