//! Image references as a profile writes them (`rust:1.83`,
//! `localhost:5000/tools@sha256:...`), and when a unit's image is pulled.
//! Parsed here, once, so a malformed digest is a profile error and every
//! backend reads the same registry, repository, tag and digest. Pure.

/// When a unit's image is pulled from its registry before the unit starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullPolicy {
    /// Never: a missing image fails the start, naming how to put it there.
    Never,
    /// Only when the engine does not have it (or not at the pinned digest).
    #[default]
    Missing,
    /// Before every start (a moved tag is followed; a pinned digest is re-checked).
    Always,
}

impl PullPolicy {
    /// The profile's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Never => "never",
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
        }
    }
}

/// The registry an image reference without one names (Docker's rule).
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// An image reference: `[registry/]repository[:tag][@digest]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The repository with its registry as written (`rust`,
    /// `localhost:5000/tools`), without tag or digest.
    pub repository: String,
    /// The tag, if written.
    pub tag: Option<String>,
    /// The content digest (`sha256:<64 hex>`), if pinned.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parse a reference; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let shape = "write an image like \"rust:1.83\", \"ghcr.io/org/tool:v1\" or \"NAME@sha256:<64 hex digits>\"";
        if text.is_empty() || text.len() > 512 {
            return Err(format!("{text:?} is not an image reference; {shape}"));
        }
        if let Some(bad) = text
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return Err(format!("{text:?} has {bad:?} in it; {shape}"));
        }
        let (named, digest) = match text.split_once('@') {
            Some((named, digest)) => (named, Some(Self::digest(text, digest)?)),
            None => (text, None),
        };
        // A ':' after the last '/' starts the tag; one before is a registry port.
        let last_slash = named.rfind('/').map_or(0, |at| at + 1);
        let (repository, tag) = match named[last_slash..].rfind(':') {
            Some(colon) => {
                let at = last_slash + colon;
                (&named[..at], Some(&named[at + 1..]))
            }
            None => (named, None),
        };
        if let Some(tag) = tag {
            let valid = !tag.is_empty()
                && tag.len() <= 128
                && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && tag
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if !valid {
                return Err(format!(
                    "{text:?}: {tag:?} is not a tag (letters, digits, '_', '.', '-', at most 128); {shape}"
                ));
            }
        }
        let mut components = repository.split('/');
        let first = components.next().unwrap_or_default();
        let has_registry = repository.contains('/') && is_registry(first);
        let path: Vec<&str> = if has_registry {
            components.collect()
        } else {
            repository.split('/').collect()
        };
        let component_ok = |part: &&str| {
            !part.is_empty()
                && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
                })
        };
        if path.is_empty() || !path.iter().all(component_ok) {
            return Err(format!(
                "{text:?}: {repository:?} is not a repository (lowercase letters, digits, '.', '_', '-', parts separated by '/'); {shape}"
            ));
        }
        Ok(Self {
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest,
        })
    }

    fn digest(text: &str, digest: &str) -> Result<String, String> {
        let hex_of = |algorithm: &str, length: usize| {
            digest
                .strip_prefix(algorithm)
                .and_then(|rest| rest.strip_prefix(':'))
                .filter(|hex| {
                    hex.len() == length
                        && hex
                            .chars()
                            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
                })
                .is_some()
        };
        if hex_of("sha256", 64) || hex_of("sha512", 128) {
            Ok(digest.to_owned())
        } else {
            Err(format!(
                "{text:?}: {digest:?} is not a digest; a pinned image is NAME@sha256:<64 lowercase hex digits> (`docker buildx imagetools inspect NAME:TAG` or `box image pull NAME:TAG` prints it)"
            ))
        }
    }

    /// The registry the image comes from (`docker.io` when none is written).
    pub fn registry(&self) -> &str {
        match self.repository.split_once('/') {
            Some((first, _)) if is_registry(first) => first,
            _ => DEFAULT_REGISTRY,
        }
    }

    /// `repository@digest` when pinned: the reference the engine resolves to
    /// exactly that content.
    pub fn pinned(&self) -> Option<String> {
        self.digest
            .as_ref()
            .map(|digest| format!("{}@{digest}", self.repository))
    }

    /// `repository:tag` (`latest` when neither tag nor digest is written):
    /// what a tag pull fetches. `None` for a digest-only reference.
    pub fn tagged(&self) -> Option<String> {
        match (&self.tag, &self.digest) {
            (Some(tag), _) => Some(format!("{}:{tag}", self.repository)),
            (None, None) => Some(format!("{}:latest", self.repository)),
            (None, Some(_)) => None,
        }
    }

    /// The repository as the engine lists it in `RepoDigests`: Docker Hub's
    /// `docker.io/` and `library/` prefixes removed.
    pub fn familiar_repository(&self) -> &str {
        familiar(&self.repository)
    }
}

/// A repository without Docker Hub's implicit prefixes (`docker.io/library/rust`
/// is `rust`), for comparing what a profile wrote with what an engine lists.
pub fn familiar(repository: &str) -> &str {
    let short = repository
        .strip_prefix("docker.io/")
        .or_else(|| repository.strip_prefix("index.docker.io/"))
        .unwrap_or(repository);
    short.strip_prefix("library/").unwrap_or(short)
}

/// Docker's rule: the first part names a registry when it has a '.' or a
/// ':' or is `localhost`.
fn is_registry(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_split_into_registry_repository_tag_and_digest() {
        let plain = ImageRef::parse("rust:1.83").unwrap();
        assert_eq!(plain.repository, "rust");
        assert_eq!(plain.tag.as_deref(), Some("1.83"));
        assert_eq!(plain.registry(), "docker.io");
        assert_eq!(plain.tagged().as_deref(), Some("rust:1.83"));
        assert_eq!(plain.pinned(), None);

        let local = ImageRef::parse(&format!("localhost:5000/tools/img@{DIGEST}")).unwrap();
        assert_eq!(local.repository, "localhost:5000/tools/img");
        assert_eq!(local.tag, None);
        assert_eq!(local.registry(), "localhost:5000");
        assert_eq!(local.tagged(), None);
        assert_eq!(
            local.pinned(),
            Some(format!("localhost:5000/tools/img@{DIGEST}"))
        );

        let both = ImageRef::parse(&format!("ghcr.io/org/tool:v1@{DIGEST}")).unwrap();
        assert_eq!(both.registry(), "ghcr.io");
        assert_eq!(both.tagged().as_deref(), Some("ghcr.io/org/tool:v1"));
        assert_eq!(both.digest.as_deref(), Some(DIGEST));

        let bare = ImageRef::parse("box-base").unwrap();
        assert_eq!(bare.tagged().as_deref(), Some("box-base:latest"));
        assert_eq!(ImageRef::parse("org/tool").unwrap().registry(), "docker.io");
        assert_eq!(
            ImageRef::parse("docker.io/library/rust:1")
                .unwrap()
                .familiar_repository(),
            "rust"
        );
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (text, says) in [
            ("rust@sha256:abc", "is not a digest"),
            ("rust@md5:0123", "is not a digest"),
            (
                "rust@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                "is not a digest",
            ),
            ("Rust:1", "is not a repository"),
            ("rust:", "is not a tag"),
            ("rust:a b", "has ' '"),
            ("", "is not an image reference"),
            ("a//b", "is not a repository"),
        ] {
            let error = ImageRef::parse(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
