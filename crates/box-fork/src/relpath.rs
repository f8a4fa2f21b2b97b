//! Paths relative to a tree's root, as bytes: what a manifest, a merge and
//! git's `-z` output name. A [`RelPath`] is checked once, where it is made
//! (walk, git output, a deserialised base): no empty, `.` or `..` component,
//! no leading `/`, no NUL, and no component that git would read as `.git`.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A checked relative path, `/`-separated, possibly not UTF-8.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(Vec<u8>);

/// Why a byte string is not a [`RelPath`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPath {
    /// Empty, or an empty component (`a//b`, a trailing `/`).
    Empty,
    /// Starts with `/`.
    Absolute,
    /// A `.` or `..` component.
    Dots,
    /// Contains a NUL byte.
    Nul,
    /// A component git treats as its own directory (`.git`, any case).
    GitDir,
}

impl fmt::Display for BadPath {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::Empty => "an empty path or path component",
            Self::Absolute => "an absolute path",
            Self::Dots => "a `.` or `..` component",
            Self::Nul => "a NUL byte",
            Self::GitDir => "a `.git` component",
        })
    }
}

/// Whether `name` is a component git reserves: `.git` in any case (git
/// refuses it in trees for the same reason: case-insensitive filesystems).
pub fn is_git_name(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b".git")
}

impl RelPath {
    /// Check `bytes` as a relative path.
    pub fn new(bytes: Vec<u8>) -> Result<Self, BadPath> {
        if bytes.is_empty() {
            return Err(BadPath::Empty);
        }
        if bytes[0] == b'/' {
            return Err(BadPath::Absolute);
        }
        if bytes.contains(&0) {
            return Err(BadPath::Nul);
        }
        for component in bytes.split(|byte| *byte == b'/') {
            match component {
                b"" => return Err(BadPath::Empty),
                b"." | b".." => return Err(BadPath::Dots),
                name if is_git_name(name) => return Err(BadPath::GitDir),
                _ => {}
            }
        }
        Ok(Self(bytes))
    }

    /// `self/name`, where `name` is one component read from a directory.
    pub fn join(parent: Option<&RelPath>, name: &[u8]) -> Result<Self, BadPath> {
        match parent {
            None => Self::new(name.to_vec()),
            Some(parent) => {
                let mut bytes = Vec::with_capacity(parent.0.len() + 1 + name.len());
                bytes.extend_from_slice(&parent.0);
                bytes.push(b'/');
                bytes.extend_from_slice(name);
                Self::new(bytes)
            }
        }
    }

    /// The bytes, `/`-separated.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// As a relative [`Path`].
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    /// As an owned relative [`PathBuf`].
    pub fn to_path_buf(&self) -> PathBuf {
        self.as_path().to_path_buf()
    }

    /// The components.
    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|byte| *byte == b'/')
    }

    /// How many components deep (`a` is 1).
    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// Every proper ancestor, shortest first (`a/b/c` → `a`, `a/b`).
    pub fn ancestors(&self) -> impl Iterator<Item = RelPath> + '_ {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte == b'/')
            .map(|(index, _)| Self(self.0[..index].to_vec()))
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}", self.as_path())
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.as_path().display())
    }
}

/// Serialised as a string when the path is UTF-8, else as an array of bytes,
/// so non-UTF-8 names survive a JSON round trip.
impl Serialize for RelPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_bytes(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer)?;
        Self::new(bytes.clone()).map_err(|bad| {
            serde::de::Error::custom(format!(
                "path {:?} is {bad}",
                String::from_utf8_lossy(&bytes)
            ))
        })
    }
}

/// A string when UTF-8, else an array of bytes.
pub(crate) fn serialize_bytes<S: Serializer>(
    bytes: &[u8],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serializer.serialize_str(text),
        Err(_) => serializer.collect_seq(bytes),
    }
}

/// The inverse of [`serialize_bytes`].
pub(crate) fn deserialize_bytes<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<u8>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Bytes {
        Text(String),
        Raw(Vec<u8>),
    }
    Ok(match Bytes::deserialize(deserializer)? {
        Bytes::Text(text) => text.into_bytes(),
        Bytes::Raw(raw) => raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_accepted() {
        for good in ["a", "a/b", "a b/\nc", ".gitignore", "x.git", ".github/x"] {
            assert!(RelPath::new(good.into()).is_ok(), "{good:?}");
        }
        for (bad, why) in [
            ("", BadPath::Empty),
            ("a//b", BadPath::Empty),
            ("a/", BadPath::Empty),
            ("/etc/passwd", BadPath::Absolute),
            ("../x", BadPath::Dots),
            ("a/./b", BadPath::Dots),
            ("a/../../b", BadPath::Dots),
            (".git/config", BadPath::GitDir),
            ("sub/.GIT/hooks/x", BadPath::GitDir),
            ("a\0b", BadPath::Nul),
        ] {
            assert_eq!(RelPath::new(bad.into()), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn non_utf8_paths_survive_json() {
        let path = RelPath::new(b"dir/caf\xe9".to_vec()).unwrap();
        let text = serde_json::to_string(&path).unwrap();
        assert_eq!(serde_json::from_str::<RelPath>(&text).unwrap(), path);
        let plain = RelPath::new(b"dir/file".to_vec()).unwrap();
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#""dir/file""#);
        assert!(serde_json::from_str::<RelPath>(r#""../escape""#).is_err());
    }

    #[test]
    fn ancestors_shortest_first() {
        let path = RelPath::new(b"a/b/c".to_vec()).unwrap();
        let ancestors: Vec<String> = path.ancestors().map(|a| a.to_string()).collect();
        assert_eq!(ancestors, ["a", "a/b"]);
        assert_eq!(path.depth(), 3);
    }
}
