//! Credentials persisted in a workspace at session start: an
//! `http.*.extraheader` in a git config (what `actions/checkout` leaves), a
//! URL with a password, a `credential.helper` that stores or embeds one,
//! a credential store file, a `.netrc`.
//!
//! [`scan_workspace`] reads files only (it never runs git), parses git
//! config as git does (`config`), follows `include.path` and
//! `includeIf.*.path` whatever their condition (a token hidden behind
//! `includeIf.gitdir:` is the known trap), and returns each finding with the
//! secret values so the host can register them with the
//! [`Redactor`](crate::Redactor); whether the session then starts is the
//! profile's decision (`on_persisted_credentials`), not this module's.
//!
//! # What is read
//!
//! A bounded walk of the workspace (no symbolic link is followed while
//! walking) finds every `.git` (a directory, or a file whose `gitdir:` is
//! inside the workspace), `.gitmodules`, `.git-credentials`, `.netrc` and
//! `_netrc`. For each git directory: `config`, `config.worktree`,
//! `worktrees/*/config.worktree`, `modules/**/config`, and the `config` of
//! its `commondir`; then every file those include, relative to the including
//! file, up to git's depth of 10; and the file a `credential.helper = store
//! --file=...` names. A file is read only if its real path (symbolic links
//! resolved) is inside the workspace and it is a regular file within the
//! size limit; anything not read is listed in [`Scan::unread`] with the
//! reason, never silently skipped. The scan is meant to run before any unit
//! of the session starts, so nothing rewrites the workspace while it reads.
//!
//! # What is a finding
//!
//! In git config: `http.extraheader` and `http.<url>.extraheader`; any
//! value or subsection holding a URL with a password, or with a token as
//! the user name (`remote.*.url`, `pushurl`, `url.<base>.insteadOf`,
//! `submodule.*.url`, `lfs.url`, `http.proxy`...); `credential.helper` as
//! `store --file=...` (the file is read) or as an inline `!command`. A file
//! git would refuse is reported unread with its line and also searched for
//! URL credentials as plain text. In `.git-credentials` and store files,
//! each URL with credentials; in `.netrc`, each `password` and `account`.

mod config;
mod credentials;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use config::parse_config;
use credentials::{
    extraheader_secrets, inline_helper_secrets, netrc_passwords, store_file, url_credentials,
    without_url_credentials,
};

/// Bounds on what a scan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest file read, in bytes.
    pub max_file_bytes: u64,
    /// Most files read.
    pub max_files: usize,
    /// Most directory entries the walk looks at.
    pub max_walk_entries: usize,
    /// Deepest directory the walk enters, below the workspace.
    pub max_walk_depth: usize,
    /// Deepest include chain followed (git's own limit is 10).
    pub max_include_depth: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_file_bytes: 1024 * 1024,
            max_files: 512,
            max_walk_entries: 200_000,
            max_walk_depth: 64,
            max_include_depth: 10,
        }
    }
}

/// What a scan found, and what it could not read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Credentials found, in the order found.
    pub findings: Vec<Finding>,
    /// Files and places not read, with why.
    pub unread: Vec<Unread>,
}

/// A credential persisted in the workspace.
#[derive(Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file, relative to the workspace.
    pub file: PathBuf,
    /// The line (1-based) the key or entry starts on.
    pub line: usize,
    /// The git config key as `git config --list` prints it (credentials in
    /// a subsection shown as `***`), or what names the entry in other files
    /// (`machine example.com`, the URL without its password).
    pub key: String,
    /// What kind of credential.
    pub kind: FindingKind,
    /// The secret values to register with the redactor: the value as
    /// written and what it decodes to (a percent-decoded password, the token
    /// inside a basic `Authorization` header).
    pub secrets: Vec<Vec<u8>>,
}

impl fmt::Debug for Finding {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secrets.
        formatter
            .debug_struct("Finding")
            .field("file", &self.file)
            .field("line", &self.line)
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

/// The kinds of persisted credential.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FindingKind {
    /// `http.extraheader` or `http.<url>.extraheader`.
    ExtraHeader,
    /// A URL with a password or a token as user name.
    UrlCredentials,
    /// An inline `credential.helper = !command`.
    InlineHelper,
    /// A line of a credential store (`.git-credentials`, `store --file`).
    CredentialStore,
    /// A `password` or `account` in a `.netrc`.
    Netrc,
}

/// A file or place the scan did not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unread {
    /// Relative to the workspace when inside it, else as written.
    pub path: PathBuf,
    /// Why.
    pub reason: UnreadReason,
}

/// Why something was not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnreadReason {
    /// Its real path is outside the workspace (an include of `~/...`, a
    /// symbolic link out, a `gitdir:` elsewhere).
    OutsideWorkspace,
    /// Not a regular file.
    NotAFile,
    /// Larger than [`Limits::max_file_bytes`].
    TooLarge {
        /// Its size.
        bytes: u64,
    },
    /// An include chain deeper than [`Limits::max_include_depth`].
    TooDeep,
    /// [`Limits::max_files`] files were read already.
    TooManyFiles,
    /// The walk stopped at [`Limits::max_walk_entries`] or
    /// [`Limits::max_walk_depth`] (the path is where).
    WalkLimit,
    /// Git would refuse the file from this line on; it was also searched for
    /// URL credentials as plain text.
    Unparsable {
        /// 1-based.
        line: usize,
    },
    /// Reading failed.
    Io(String),
}

impl fmt::Display for Unread {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.reason {
            UnreadReason::OutsideWorkspace => {
                write!(formatter, "{path}: outside the workspace, not read")
            }
            UnreadReason::NotAFile => write!(formatter, "{path}: not a regular file, not read"),
            UnreadReason::TooLarge { bytes } => write!(
                formatter,
                "{path}: {bytes} bytes, over the scan's limit, not read"
            ),
            UnreadReason::TooDeep => write!(
                formatter,
                "{path}: included deeper than the scan's include depth, not read"
            ),
            UnreadReason::TooManyFiles => {
                write!(formatter, "{path}: over the scan's file count, not read")
            }
            UnreadReason::WalkLimit => write!(
                formatter,
                "{path}: the workspace walk stopped here at its limit"
            ),
            UnreadReason::Unparsable { line } => write!(
                formatter,
                "{path}:{line}: git would refuse this config; searched as text only"
            ),
            UnreadReason::Io(error) => write!(formatter, "{path}: {error}"),
        }
    }
}

/// The workspace itself cannot be scanned.
#[derive(Debug, thiserror::Error)]
pub enum PersistedError {
    /// It does not exist or cannot be resolved.
    #[error("cannot scan workspace {path} for persisted credentials: {source}")]
    Workspace {
        /// The workspace as given.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Scan `workspace` for persisted credentials with the default [`Limits`].
pub fn scan_workspace(workspace: &Path) -> Result<Scan, PersistedError> {
    scan_workspace_with(workspace, &Limits::default())
}

/// Scan `workspace` for persisted credentials within `limits`.
pub fn scan_workspace_with(workspace: &Path, limits: &Limits) -> Result<Scan, PersistedError> {
    let root = workspace
        .canonicalize()
        .map_err(|source| PersistedError::Workspace {
            path: workspace.to_owned(),
            source,
        })?;
    let mut scanner = Scanner {
        root,
        limits: *limits,
        scan: Scan::default(),
        read: BTreeSet::new(),
        git_dirs: BTreeSet::new(),
    };
    scanner.walk();
    Ok(scanner.scan)
}

struct Scanner {
    /// The workspace, canonical.
    root: PathBuf,
    limits: Limits,
    scan: Scan,
    /// Canonical paths already read (each file once; ends include cycles).
    read: BTreeSet<PathBuf>,
    /// Canonical git directories already scanned.
    git_dirs: BTreeSet<PathBuf>,
}

/// How a file's content is read for credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    GitConfig { include_depth: usize },
    CredentialStore,
    Netrc,
}

impl Scanner {
    fn walk(&mut self) {
        let mut stack = vec![(self.root.clone(), 0usize)];
        let mut entries_seen = 0usize;
        while let Some((directory, depth)) = stack.pop() {
            let Ok(listing) = std::fs::read_dir(&directory) else {
                self.unread(
                    &directory,
                    UnreadReason::Io("cannot list the directory".to_owned()),
                );
                continue;
            };
            let mut names: Vec<_> = listing.flatten().collect();
            // Deterministic order.
            names.sort_by_key(std::fs::DirEntry::file_name);
            for entry in names {
                entries_seen += 1;
                if entries_seen > self.limits.max_walk_entries {
                    self.unread(&directory, UnreadReason::WalkLimit);
                    return;
                }
                let path = entry.path();
                let Ok(file_type) = entry.file_type() else {
                    continue;
                };
                let name = entry.file_name();
                match name.to_str() {
                    Some(".git") if file_type.is_dir() || path.is_dir() => self.scan_git_dir(&path),
                    Some(".git") => self.scan_git_file(&path),
                    Some(".gitmodules") => {
                        self.read_file(&path, FileKind::GitConfig { include_depth: 0 })
                    }
                    Some(".git-credentials") => self.read_file(&path, FileKind::CredentialStore),
                    Some(".netrc" | "_netrc") => self.read_file(&path, FileKind::Netrc),
                    _ if file_type.is_dir() => {
                        if depth + 1 > self.limits.max_walk_depth {
                            self.unread(&path, UnreadReason::WalkLimit);
                        } else {
                            stack.push((path, depth + 1));
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// A `.git` file: `gitdir: <path>`, relative to the file's directory.
    fn scan_git_file(&mut self, path: &Path) {
        let Some((_, text)) = self.read_bounded(path) else {
            return;
        };
        let text = String::from_utf8_lossy(&text);
        let Some(target) = text.lines().find_map(|line| line.strip_prefix("gitdir:")) else {
            return;
        };
        let base = path.parent().unwrap_or(&self.root);
        let git_dir = base.join(target.trim());
        match self.inside(&git_dir) {
            Ok(git_dir) => self.scan_git_dir(&git_dir),
            Err(reason) => self.unread(&git_dir, reason),
        }
    }

    fn scan_git_dir(&mut self, git_dir: &Path) {
        let canonical = match self.inside(git_dir) {
            Ok(canonical) => canonical,
            Err(reason) => {
                self.unread(git_dir, reason);
                return;
            }
        };
        if !self.git_dirs.insert(canonical.clone()) {
            return;
        }
        let config = FileKind::GitConfig { include_depth: 0 };
        for name in ["config", "config.worktree"] {
            let path = canonical.join(name);
            if path.symlink_metadata().is_ok() {
                self.read_file(&path, config);
            }
        }
        // A linked worktree's git directory shares its repository's config.
        let commondir = canonical.join("commondir");
        if commondir.symlink_metadata().is_ok()
            && let Some((_, common)) = self.read_bounded(&commondir)
        {
            let common = canonical.join(String::from_utf8_lossy(&common).trim());
            match self.inside(&common) {
                Ok(common) => self.scan_git_dir(&common),
                Err(reason) => self.unread(&common, reason),
            }
        }
        for path in self.child_dirs(&canonical.join("worktrees")) {
            let path = path.join("config.worktree");
            if path.symlink_metadata().is_ok() {
                self.read_file(&path, config);
            }
        }
        // Submodules' git directories, nested as modules/a/modules/b.
        let mut modules = self.child_dirs(&canonical.join("modules"));
        while let Some(module) = modules.pop() {
            if module.join("config").symlink_metadata().is_ok() {
                self.scan_git_dir(&module);
            } else {
                modules.extend(self.child_dirs(&module));
            }
        }
    }

    /// The directories in `directory` (not through symbolic links), sorted.
    fn child_dirs(&self, directory: &Path) -> Vec<PathBuf> {
        let Ok(listing) = std::fs::read_dir(directory) else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = listing
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|file_type| file_type.is_dir()))
            .map(|entry| entry.path())
            .collect();
        dirs.sort();
        dirs
    }

    fn read_file(&mut self, path: &Path, kind: FileKind) {
        let Some((path, text)) = self.read_bounded(path) else {
            return;
        };
        let file = self.relative(&path);
        match kind {
            FileKind::GitConfig { include_depth } => {
                self.git_config(&path, &file, &text, include_depth)
            }
            FileKind::CredentialStore => self.credential_store(&file, &text),
            FileKind::Netrc => {
                for password in netrc_passwords(&text) {
                    self.scan.findings.push(Finding {
                        file: file.clone(),
                        line: password.line,
                        key: format!("machine {}", password.machine),
                        kind: FindingKind::Netrc,
                        secrets: vec![password.secret],
                    });
                }
            }
        }
    }

    fn git_config(&mut self, path: &Path, file: &Path, text: &[u8], include_depth: usize) {
        let (entries, error) = parse_config(text);
        for entry in &entries {
            let key = without_url_credentials(entry.key().as_bytes());
            if let Some(subsection) = &entry.subsection {
                for credential in url_credentials(subsection) {
                    self.finding(
                        file,
                        entry.line,
                        &key,
                        FindingKind::UrlCredentials,
                        credential.secrets,
                    );
                }
            }
            let Some(value) = &entry.value else {
                continue;
            };
            for credential in url_credentials(value) {
                self.finding(
                    file,
                    entry.line,
                    &key,
                    FindingKind::UrlCredentials,
                    credential.secrets,
                );
            }
            match (entry.section.as_str(), entry.name.as_str()) {
                ("http", "extraheader") => {
                    self.finding(
                        file,
                        entry.line,
                        &key,
                        FindingKind::ExtraHeader,
                        extraheader_secrets(value),
                    );
                }
                ("credential", "helper") => {
                    if value.first() == Some(&b'!') {
                        self.finding(
                            file,
                            entry.line,
                            &key,
                            FindingKind::InlineHelper,
                            inline_helper_secrets(value),
                        );
                    } else if let Some(store) = store_file(value) {
                        // The helper runs where git runs: a relative path is
                        // taken from the workspace's top.
                        let root = self.root.clone();
                        self.follow(&root, &store, FileKind::CredentialStore);
                    }
                }
                ("include", "path") if entry.subsection.is_none() => {
                    self.include(path, value, include_depth);
                }
                ("includeif", "path") if entry.subsection.is_some() => {
                    self.include(path, value, include_depth);
                }
                _ => {}
            }
        }
        if let Some(error) = error {
            self.unread(path, UnreadReason::Unparsable { line: error.line });
            // What git would not parse may still hold a URL with a password.
            let known: BTreeSet<Vec<u8>> = self
                .scan
                .findings
                .iter()
                .filter(|finding| finding.file == file)
                .flat_map(|finding| finding.secrets.iter().cloned())
                .collect();
            for credential in url_credentials(text) {
                if credential
                    .secrets
                    .iter()
                    .any(|secret| known.contains(secret))
                {
                    continue;
                }
                let line = line_of(text, credential.secret_range.start);
                self.finding(
                    file,
                    line,
                    "(unparsable line)",
                    FindingKind::UrlCredentials,
                    credential.secrets,
                );
            }
        }
    }

    /// Follow an include (any condition: it may be true when git runs).
    fn include(&mut self, including: &Path, value: &[u8], include_depth: usize) {
        let base = including.parent().unwrap_or(&self.root).to_owned();
        if include_depth + 1 > self.limits.max_include_depth {
            let target = resolve_path(&base, value).unwrap_or_else(|(written, _)| written);
            self.unread(&target, UnreadReason::TooDeep);
            return;
        }
        self.follow(
            &base,
            value,
            FileKind::GitConfig {
                include_depth: include_depth + 1,
            },
        );
    }

    /// Read the file `value` names, relative to `base`, if it exists (git
    /// skips a missing include; a missing store has nothing).
    fn follow(&mut self, base: &Path, value: &[u8], kind: FileKind) {
        match resolve_path(base, value) {
            Ok(target) if target.symlink_metadata().is_err() => {}
            Ok(target) => self.read_file(&target, kind),
            Err((written, reason)) => self.unread(&written, reason),
        }
    }

    fn credential_store(&mut self, file: &Path, text: &[u8]) {
        for (index, line) in text.split(|&byte| byte == b'\n').enumerate() {
            for credential in url_credentials(line) {
                let key = without_url_credentials(line.trim_ascii());
                self.finding(
                    file,
                    index + 1,
                    &key,
                    FindingKind::CredentialStore,
                    credential.secrets,
                );
            }
        }
    }

    fn finding(
        &mut self,
        file: &Path,
        line: usize,
        key: &str,
        kind: FindingKind,
        secrets: Vec<Vec<u8>>,
    ) {
        self.scan.findings.push(Finding {
            file: file.to_owned(),
            line,
            key: key.to_owned(),
            kind,
            secrets,
        });
    }

    /// The file's real path and bytes, if it is inside the workspace, a
    /// regular file, within the limits and not read before; otherwise
    /// records why not.
    fn read_bounded(&mut self, path: &Path) -> Option<(PathBuf, Vec<u8>)> {
        let canonical = match self.inside(path) {
            Ok(canonical) => canonical,
            Err(reason) => {
                self.unread(path, reason);
                return None;
            }
        };
        if self.read.contains(&canonical) {
            return None;
        }
        if self.read.len() >= self.limits.max_files {
            self.unread(path, UnreadReason::TooManyFiles);
            return None;
        }
        let metadata = match canonical.metadata() {
            Ok(metadata) => metadata,
            Err(error) => {
                self.unread(path, UnreadReason::Io(error.to_string()));
                return None;
            }
        };
        // Checked before opening: opening a FIFO would block.
        if !metadata.is_file() {
            self.unread(path, UnreadReason::NotAFile);
            return None;
        }
        if metadata.len() > self.limits.max_file_bytes {
            self.unread(
                path,
                UnreadReason::TooLarge {
                    bytes: metadata.len(),
                },
            );
            return None;
        }
        self.read.insert(canonical.clone());
        let mut text = Vec::new();
        let read = std::fs::File::open(&canonical)
            .and_then(|file| file.take(self.limits.max_file_bytes).read_to_end(&mut text));
        match read {
            Ok(_) => Some((canonical, text)),
            Err(error) => {
                self.unread(path, UnreadReason::Io(error.to_string()));
                None
            }
        }
    }

    /// `path`'s real path if it is inside the workspace.
    fn inside(&self, path: &Path) -> Result<PathBuf, UnreadReason> {
        let canonical = path
            .canonicalize()
            .map_err(|error| UnreadReason::Io(error.to_string()))?;
        if canonical.starts_with(&self.root) {
            Ok(canonical)
        } else {
            Err(UnreadReason::OutsideWorkspace)
        }
    }

    fn relative(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.root)
            .map_or_else(|_| path.to_owned(), Path::to_owned)
    }

    fn unread(&mut self, path: &Path, reason: UnreadReason) {
        let unread = Unread {
            path: self.relative(path),
            reason,
        };
        if !self.scan.unread.contains(&unread) {
            self.scan.unread.push(unread);
        }
    }
}

/// Where an include or store path points, as git resolves it: relative to
/// `base` (the including file's directory; the file system resolves `..`
/// after symbolic links, as when git opens it); `~` is the host's home,
/// outside any workspace (`Err` with the path as written).
fn resolve_path(base: &Path, value: &[u8]) -> Result<PathBuf, (PathBuf, UnreadReason)> {
    let text = String::from_utf8_lossy(value);
    let written = PathBuf::from(text.as_ref());
    if text.starts_with('~') {
        return Err((written, UnreadReason::OutsideWorkspace));
    }
    Ok(base.join(written))
}

fn line_of(text: &[u8], offset: usize) -> usize {
    text[..offset.min(text.len())]
        .iter()
        .filter(|&&byte| byte == b'\n')
        .count()
        + 1
}
