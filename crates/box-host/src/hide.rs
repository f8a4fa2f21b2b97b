//! `on_persisted_credentials = "hide"`: the workspace unit sees each file that
//! holds a persisted credential replaced, read-only, by a copy with every
//! value found in it masked. The host's file is never changed.
//!
//! The copies live in a directory of the session's own under the host's
//! runtime directory, removed when the [`Masks`] is dropped (the session's
//! end, or a start that failed). A file is read through `openat2` beneath the
//! workspace with no symbolic link followed, so a link planted after the scan
//! (by another session sharing the directory) cannot make the host copy a file
//! from outside the workspace into a unit.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use box_backend::FileMask;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

/// What a masked value reads as inside the unit: plain letters, so the file
/// still parses (a git config value, a URL's password, a `.netrc` token).
pub const PLACEHOLDER: &[u8] = b"HIDDEN-BY-BOX";

/// Files larger than this are not copied (the scanner reads no larger ones).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// A session's masked copies, removed on drop.
pub struct Masks {
    dir: PathBuf,
    masks: Vec<FileMask>,
}

impl Masks {
    /// Copy each of `files` (relative to `workspace`, with the values found in
    /// it) into a new directory under `runtime_dir`, the values replaced by
    /// [`PLACEHOLDER`].
    pub fn make(
        runtime_dir: &Path,
        workspace: &Path,
        files: &[(PathBuf, Vec<Vec<u8>>)],
    ) -> Result<Self, String> {
        let parent = runtime_dir.join("masks");
        crate::egress::create_private_dir(&parent)?;
        let dir = parent.join(format!("{:032x}", rand::random::<u128>()));
        std::fs::create_dir(&dir)
            .map_err(|error| format!("creating {}: {error}", dir.display()))?;
        // Dropped (and the directory removed) on any failure below.
        let mut made = Self {
            dir,
            masks: Vec::new(),
        };
        // Mounted into one unit only; its user (any uid) must read the copies.
        std::fs::set_permissions(&made.dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|error| format!("{}: {error}", made.dir.display()))?;
        let root = std::fs::File::open(workspace)
            .map_err(|error| format!("opening the workspace {}: {error}", workspace.display()))?;
        for (index, (file, values)) in files.iter().enumerate() {
            if !file
                .components()
                .all(|part| matches!(part, Component::Normal(_)))
            {
                return Err(format!(
                    "{} is not a plain path inside the workspace",
                    file.display()
                ));
            }
            let content = read_beneath(&root, file)
                .map_err(|error| format!("reading {} to mask it: {error}", file.display()))?;
            let masked = mask(&content, values);
            let copy = made.dir.join(format!("{index}"));
            std::fs::write(&copy, masked)
                .and_then(|()| {
                    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o444))
                })
                .map_err(|error| format!("writing {}: {error}", copy.display()))?;
            made.masks.push(FileMask {
                source: copy,
                target: file.clone(),
            });
        }
        Ok(made)
    }

    /// What the backend mounts.
    pub fn wiring(&self) -> &[FileMask] {
        &self.masks
    }
}

impl Drop for Masks {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), %error, "removing the masked copies");
        }
    }
}

/// A regular file beneath `root`, no link followed, at most [`MAX_FILE_BYTES`].
fn read_beneath(root: &std::fs::File, file: &Path) -> std::io::Result<Vec<u8>> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK)
        .mode(Mode::empty())
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let fd = openat2(root, file, how).map_err(std::io::Error::from)?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "{} bytes, more than the {MAX_FILE_BYTES} box copies",
            meta.len()
        )));
    }
    let mut content = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut content)?;
    Ok(content)
}

/// `content` with every occurrence of each of `values` (longest first, so a
/// value containing another is masked whole) replaced by [`PLACEHOLDER`].
pub fn mask(content: &[u8], values: &[Vec<u8>]) -> Vec<u8> {
    let mut values: Vec<&[u8]> = values
        .iter()
        .map(Vec::as_slice)
        .filter(|value| !value.is_empty())
        .collect();
    values.sort_by_key(|value| std::cmp::Reverse(value.len()));
    let mut out = content.to_vec();
    for value in values {
        let mut next = Vec::with_capacity(out.len());
        let mut rest = out.as_slice();
        while let Some(at) = find(rest, value) {
            next.extend_from_slice(&rest[..at]);
            next.extend_from_slice(PLACEHOLDER);
            rest = &rest[at + value.len()..];
        }
        next.extend_from_slice(rest);
        out = next;
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_masked_longest_first() {
        let content = b"[http]\n\textraheader = AUTHORIZATION: basic dXNlcjpzM2NyZXQtdmFsdWU=\n[remote \"o\"]\n\turl = https://me:s3cret-value@example.com/r\n";
        let masked = mask(
            content,
            &[
                b"s3cret-value".to_vec(),
                b"dXNlcjpzM2NyZXQtdmFsdWU=".to_vec(),
                Vec::new(),
            ],
        );
        let masked = String::from_utf8(masked).unwrap();
        assert!(!masked.contains("s3cret-value"), "{masked}");
        assert!(!masked.contains("dXNlcjpz"), "{masked}");
        assert!(
            masked.contains("extraheader = AUTHORIZATION: basic HIDDEN-BY-BOX"),
            "{masked}"
        );
        assert!(
            masked.contains("https://me:HIDDEN-BY-BOX@example.com/r"),
            "{masked}"
        );
    }

    #[test]
    fn copies_are_made_beneath_the_workspace_and_removed_on_drop() {
        let workspace = tempfile::tempdir().unwrap();
        let runtime = tempfile::tempdir().unwrap();
        std::fs::create_dir(workspace.path().join(".git")).unwrap();
        std::fs::write(
            workspace.path().join(".git/config"),
            "url = https://u:tok3n-value-1@h/\n",
        )
        .unwrap();
        let files = vec![(
            PathBuf::from(".git/config"),
            vec![b"tok3n-value-1".to_vec()],
        )];
        let masks = Masks::make(runtime.path(), workspace.path(), &files).unwrap();
        let [mask] = masks.wiring() else {
            panic!("one mask: {:?}", masks.wiring())
        };
        assert_eq!(mask.target, PathBuf::from(".git/config"));
        assert_eq!(
            std::fs::read_to_string(&mask.source).unwrap(),
            "url = https://u:HIDDEN-BY-BOX@h/\n"
        );
        let source = mask.source.clone();
        drop(masks);
        assert!(!source.exists());
        // The host's file is untouched.
        assert!(
            std::fs::read_to_string(workspace.path().join(".git/config"))
                .unwrap()
                .contains("tok3n-value-1")
        );
    }

    /// A link planted where the scan saw a file is never followed: the host
    /// copies nothing from outside the workspace into a unit.
    #[test]
    fn a_link_out_of_the_workspace_is_refused() {
        let workspace = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let runtime = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("canary"), "host-canary-secret").unwrap();
        std::os::unix::fs::symlink(outside.path(), workspace.path().join(".git")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("canary"),
            workspace.path().join(".netrc"),
        )
        .unwrap();
        for file in [".git/canary", ".netrc", "../x"] {
            let files = vec![(PathBuf::from(file), vec![b"whatever-value".to_vec()])];
            let refused = Masks::make(runtime.path(), workspace.path(), &files)
                .err()
                .unwrap_or_else(|| panic!("{file} was copied"));
            assert!(
                refused.contains(file.trim_start_matches("../")),
                "{refused}"
            );
        }
        // Nothing left behind.
        let left: Vec<_> = std::fs::read_dir(runtime.path().join("masks"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
