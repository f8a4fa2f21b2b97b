//! Putting a unit's image on the engine: pulled through the engine's API per
//! the unit's pull policy, with the registry's credentials from the Docker
//! config file, and a pinned image (`NAME@sha256:...`) verified to be that
//! content before a unit starts.
//!
//! Why verify when the engine already checks a pulled manifest against the
//! digest asked for: an image found locally was never pulled by us, and a
//! `NAME:TAG@sha256:...` pin is pulled by its tag (so a moved tag is caught
//! and both digests named); `RepoDigests` is what the engine recorded when the
//! content arrived, so the pin must be among them.

use std::collections::BTreeMap;
use std::sync::Arc;

use bollard::auth::DockerCredentials;
use bollard::models::{CreateImageInfo, ImageInspect};
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures::StreamExt;

use box_policy::image::{DEFAULT_REGISTRY, ImageRef, PullPolicy, familiar};

use crate::{DockerBackend, engine_message, status_of};

impl DockerBackend {
    /// The backend's client, for pulls.
    pub fn puller(&self) -> Puller {
        Puller {
            docker: self.docker.clone(),
        }
    }
}

/// One progress event of a pull, as the engine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullEvent {
    /// The image being pulled, as written.
    pub image: String,
    /// The layer (short id) the event is about; `None` for the image's own lines.
    pub layer: Option<String>,
    /// The engine's word (`Downloading`, `Pull complete`, `Already exists`, ...).
    pub status: String,
    /// Bytes done of the current step (download or extraction).
    pub current: Option<u64>,
    /// Bytes of the current step in all.
    pub total: Option<u64>,
}

/// Where a pull's progress goes (a terminal, a log, a session's progress).
pub type PullSink = Arc<dyn Fn(&PullEvent) + Send + Sync>;

/// An image the engine now has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The reference pulled, as written.
    pub image: String,
    /// The engine's image id (`sha256:...` of its config).
    pub id: String,
    /// The registry's content digest of it (`sha256:...`), when a registry
    /// knows it.
    pub digest: Option<String>,
    /// Whether anything was downloaded (false: the engine had it all).
    pub downloaded: bool,
}

/// Why an image could not be put on the engine or was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// The reference itself is malformed.
    #[error("image {image:?}: {message}")]
    Reference {
        /// As written.
        image: String,
        /// What is wrong with it.
        message: String,
    },
    /// The registry could not be reached, refused, or has no such image.
    #[error("pulling {image} from registry {registry} failed: {message}{hint}")]
    Registry {
        /// As written.
        image: String,
        /// The registry asked.
        registry: String,
        /// The engine's message.
        message: String,
        /// What to try, when the message suggests something.
        hint: String,
    },
    /// A `NAME:TAG@DIGEST` pin whose tag names other content now.
    #[error(
        "image {image} is pinned to {pinned}, but {tagged} in registry {registry} is {found}: refused (the tag moved or the pin is wrong; pin the digest you reviewed)"
    )]
    TagMoved {
        /// As written.
        image: String,
        /// The registry.
        registry: String,
        /// `NAME:TAG`.
        tagged: String,
        /// The digest the profile pins.
        pinned: String,
        /// The digest the registry's tag has.
        found: String,
    },
    /// The engine's image does not carry the pinned digest.
    #[error(
        "image {image} is pinned to {pinned}, but the engine's image {id} has digests {found:?}: refused (remove it with `docker rmi {id}` and start again to pull the pinned content)"
    )]
    Unverified {
        /// As written.
        image: String,
        /// The digest the profile pins.
        pinned: String,
        /// The engine's image id.
        id: String,
        /// Its `RepoDigests`.
        found: Vec<String>,
    },
    /// The unit's `pull_secret` names a host variable that is unset or does
    /// not hold `user:password` (the value is never in the message).
    #[error(
        "pulling {image}: pull_secret {name}: {problem} (set {name}=user:password in box's environment, or remove pull_secret to use the Docker config file's credentials)"
    )]
    Secret {
        /// As written.
        image: String,
        /// The variable's name.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The engine failed otherwise.
    #[error("{doing} {image}: {message}")]
    Engine {
        /// As written.
        image: String,
        /// What was being done.
        doing: String,
        /// The engine's message.
        message: String,
    },
}

/// An image on the engine, ready for a unit: its inspection and the digest the
/// envelope reports.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The engine's inspection of it.
    pub inspect: ImageInspect,
    /// The registry's content digest, when known.
    pub digest: Option<String>,
}

/// Why a unit's image is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Missing and not to be pulled; the remedy says what puts it there.
    Missing {
        /// What to do.
        remedy: String,
    },
    /// A pull or a verification failed.
    Pull(PullError),
}

/// Box's own images (built by `box image build [dev|fetch]` or
/// `scripts/test-images.sh`), which are in no registry: never pulled.
pub fn is_box_image(image: &str) -> bool {
    let name = image.split(['@', ':']).next().unwrap_or(image);
    matches!(name, "box-base" | "box-rootfs" | "box-dev" | "box-fetch")
        || name.starts_with("box-test-")
}

/// What puts a missing `image` on the engine: box's own images are built by
/// `box image build` for the Debian suite their tag names, its test fixtures
/// by `scripts/test-images.sh`; any other image is pulled (`box image pull`,
/// or at start unless `pull = "never"`).
pub fn missing_image_remedy(image: &str, pull: PullPolicy) -> String {
    let name = image.split(['@', ':']).next().unwrap_or(image);
    let build = crate::body::BUILD_COMMAND;
    // `box image build` tags box-rootfs, box-base and box-dev by the suite
    // it builds (`--suite`, default bookworm): the tag says which to build.
    let suite = box_image_tag(image);
    match name {
        "box-base" | "box-rootfs" | "box-dev" => {
            let Some(suite) = suite.filter(|tag| is_suite_name(tag)) else {
                return format!(
                    "box builds {name} only tagged by a Debian suite ({name}:bookworm with `{build}{dev}`, {name}:SUITE with `{build}{dev} --suite SUITE`), and {image} names none: name a suite in the profile's image",
                    dev = if name == "box-dev" { " dev" } else { "" },
                );
            };
            if name == "box-dev" {
                // The toolchain image is built on box-base of the same suite,
                // which the first command builds if it is missing.
                format!("build it with `{build} --suite {suite} && {build} dev --suite {suite}`")
            } else {
                format!("build it with `{build} --suite {suite}`")
            }
        }
        // The `fetch` example profile's server image: always tagged latest.
        "box-fetch" if suite.is_none_or(|tag| tag == "latest") => {
            format!("build it with `{build} fetch`")
        }
        "box-fetch" => format!(
            "`{build} fetch` builds only box-fetch:latest, not {image}: name box-fetch:latest in the profile's image"
        ),
        _ if name.starts_with("box-test-") => {
            "build it with `scripts/test-images.sh` (box's test fixtures)".to_owned()
        }
        _ if pull == PullPolicy::Never => format!(
            "the unit's pull policy is \"never\", so box does not fetch it: put it on the engine with `box image pull {image}` (or `docker pull {image}`), or write pull = \"missing\" in the profile's unit table, then start again"
        ),
        _ => format!(
            "put it on the engine with `box image pull {image}` (or `docker pull {image}`), then start again"
        ),
    }
}

/// The tag of a box image named by name (`box-base:trixie` → `trixie`);
/// `None` for a bare name (docker's `latest`) or a digest.
fn box_image_tag(image: &str) -> Option<&str> {
    if image.contains('@') {
        return None;
    }
    image.split_once(':').map(|(_, tag)| tag)
}

/// Whether `tag` can be a Debian suite (`bookworm`, `trixie`, `sid`), the
/// only tags `box image build` gives.
fn is_suite_name(tag: &str) -> bool {
    tag.starts_with(|c: char| c.is_ascii_lowercase())
        && tag
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && tag != "latest"
}

/// The status line that carries the pulled manifest's digest.
const DIGEST_PREFIX: &str = "Digest: ";

/// A pull's progress in numbers: layers and bytes, for one updating line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullTally {
    layers: BTreeMap<String, Layer>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Layer {
    downloaded: u64,
    size: Option<u64>,
    done: bool,
    existed: bool,
    extracting: bool,
}

/// What [`PullTally::summary`] says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullSummary {
    /// Layers the image has (as announced so far).
    pub layers: usize,
    /// Layers finished (pulled or already there).
    pub done: usize,
    /// Layers the engine already had.
    pub existed: usize,
    /// Bytes downloaded.
    pub downloaded: u64,
    /// Bytes to download, of the layers whose size is known.
    pub to_download: u64,
    /// Whether a layer is being extracted.
    pub extracting: bool,
}

impl PullTally {
    /// Count one event.
    pub fn add(&mut self, event: &PullEvent) {
        let Some(id) = &event.layer else {
            return;
        };
        // The image's own lines ("Pulling from NAME") carry its tag as the id.
        if event.status.starts_with("Pulling from") {
            return;
        }
        let layer = self.layers.entry(id.clone()).or_default();
        match event.status.as_str() {
            "Downloading" => {
                layer.downloaded = event.current.unwrap_or(layer.downloaded);
                if event.total.is_some() {
                    layer.size = event.total;
                }
            }
            "Verifying Checksum" | "Download complete" => {
                if let Some(size) = layer.size {
                    layer.downloaded = size;
                }
            }
            "Extracting" => {
                layer.extracting = true;
                if let Some(size) = layer.size {
                    layer.downloaded = size;
                }
            }
            "Pull complete" => {
                layer.done = true;
                layer.extracting = false;
                if let Some(size) = layer.size {
                    layer.downloaded = size;
                }
            }
            "Already exists" => {
                layer.done = true;
                layer.existed = true;
            }
            _ => {}
        }
    }

    /// The numbers so far.
    pub fn summary(&self) -> PullSummary {
        let mut summary = PullSummary {
            layers: self.layers.len(),
            ..PullSummary::default()
        };
        for layer in self.layers.values() {
            summary.done += usize::from(layer.done);
            summary.existed += usize::from(layer.existed);
            summary.downloaded += layer.downloaded;
            summary.to_download += layer.size.unwrap_or(0);
            summary.extracting |= layer.extracting;
        }
        summary
    }
}

/// The least time between two progress reports of one pull to a
/// [`box_backend::StartProgress`] (a layer finishing is always reported).
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// The sink a unit's start pulls with: `own` (the backend's, `box run`'s
/// terminal) and the host's `progress` (MCP progress), either or both.
pub fn start_sink(
    own: Option<&PullSink>,
    progress: Option<&box_backend::StartProgress>,
) -> Option<PullSink> {
    let Some(progress) = progress.cloned() else {
        return own.cloned();
    };
    let own = own.cloned();
    let state = std::sync::Mutex::new((PullTally::default(), None::<std::time::Instant>, 0usize));
    Some(Arc::new(move |event: &PullEvent| {
        if let Some(own) = &own {
            own(event);
        }
        let Ok(mut state) = state.lock() else {
            return;
        };
        let (tally, reported, done_before) = &mut *state;
        tally.add(event);
        let summary = tally.summary();
        let due = reported.is_none_or(|at| at.elapsed() >= REPORT_EVERY);
        if !due && summary.done == *done_before {
            return;
        }
        *reported = Some(std::time::Instant::now());
        *done_before = summary.done;
        (progress.0)(box_backend::ProgressReport {
            message: format!(
                "pulling {}: {}/{} layers",
                event.image, summary.done, summary.layers
            ),
            done: summary.downloaded,
            total: (summary.to_download > 0).then_some(summary.to_download),
        });
    }))
}

fn event_of(image: &str, info: &CreateImageInfo) -> PullEvent {
    let detail = info.progress_detail.as_ref();
    let bytes = |value: Option<i64>| value.and_then(|n| u64::try_from(n).ok());
    PullEvent {
        image: image.to_owned(),
        layer: info.id.clone().filter(|id| !id.is_empty()),
        status: info.status.clone().unwrap_or_default(),
        current: detail.and_then(|d| bytes(d.current)),
        total: detail.and_then(|d| bytes(d.total)).filter(|&n| n > 0),
    }
}

/// The engine client a pull needs, and no more: `box image pull` starts no
/// unit, so it gathers none of [`DockerBackend::connect`]'s engine facts.
#[derive(Clone)]
pub struct Puller {
    docker: bollard::Docker,
}

impl Puller {
    /// Connect to the local engine (DOCKER_HOST or the default socket) and
    /// negotiate the API version.
    pub async fn connect() -> Result<Self, crate::ConnectError> {
        let no_engine = |e: bollard::errors::Error| crate::ConnectError::NoEngine {
            cause: e.to_string(),
        };
        let docker = bollard::Docker::connect_with_defaults()
            .map_err(no_engine)?
            .negotiate_version()
            .await
            .map_err(no_engine)?;
        Ok(Self { docker })
    }

    /// Pull `image` from its registry, reporting progress to `sink`; a pinned
    /// image is verified to be the pinned content. The credentials: the value
    /// of the host variable `secret` names (`user:password`) when given, else
    /// what the Docker config file holds for that registry.
    pub async fn pull_image(
        &self,
        image: &str,
        sink: Option<&PullSink>,
        secret: Option<&str>,
    ) -> Result<Pulled, PullError> {
        let reference = ImageRef::parse(image).map_err(|message| PullError::Reference {
            image: image.to_owned(),
            message,
        })?;
        let registry = reference.registry().to_owned();
        // By tag when one is written (a tag@digest pin then catches a moved
        // tag), else by the digest; the engine checks the content it fetches
        // against the digest it asked for.
        let (tag, by_tag) = match (&reference.tag, &reference.digest) {
            (Some(tag), _) => (tag.clone(), true),
            (None, Some(digest)) => (digest.clone(), false),
            (None, None) => ("latest".to_owned(), true),
        };
        let options = CreateImageOptionsBuilder::new()
            .from_image(&reference.repository)
            .tag(&tag)
            .build();
        let credentials = match secret {
            Some(name) => Some(credentials_from_secret(image, &registry, name)?),
            None => credentials_for(&registry),
        };
        tracing::info!(image, registry, secret, "pulling");
        let mut stream = self.docker.create_image(Some(options), None, credentials);
        let mut digest: Option<String> = None;
        let mut downloaded = false;
        while let Some(item) = stream.next().await {
            let info = item.map_err(|error| registry_error(image, &registry, &error))?;
            let event = event_of(image, &info);
            if let Some(found) = event.status.strip_prefix(DIGEST_PREFIX) {
                digest = Some(found.trim().to_owned());
            }
            downloaded |= event.status == "Downloading" || event.status == "Pull complete";
            if let Some(sink) = sink {
                sink(&event);
            }
        }
        if by_tag
            && let (Some(pinned), Some(found)) = (&reference.digest, &digest)
            && pinned != found
        {
            return Err(PullError::TagMoved {
                image: image.to_owned(),
                registry,
                tagged: reference.tagged().unwrap_or_default(),
                pinned: pinned.clone(),
                found: found.clone(),
            });
        }
        let ready = self.verified(image, &reference).await?;
        tracing::info!(
            image,
            digest = ready.digest.as_deref().unwrap_or(""),
            "pulled"
        );
        Ok(Pulled {
            image: image.to_owned(),
            id: ready.inspect.id.clone().unwrap_or_default(),
            digest: ready.digest.or(digest),
            downloaded,
        })
    }

    /// The engine's image for `reference`, verified against its pin.
    async fn verified(&self, image: &str, reference: &ImageRef) -> Result<Ready, PullError> {
        let lookup = reference.pinned().unwrap_or_else(|| image.to_owned());
        let inspect =
            self.docker
                .inspect_image(&lookup)
                .await
                .map_err(|error| PullError::Engine {
                    image: image.to_owned(),
                    doing: "inspecting the image".to_owned(),
                    message: engine_message(&error),
                })?;
        let digest = verify_digest(image, reference, &inspect)?;
        Ok(Ready { inspect, digest })
    }

    /// Put `image` on the engine as `pull` says, verified, before a unit starts.
    pub async fn ready_image(
        &self,
        image: &str,
        pull: PullPolicy,
        sink: Option<&PullSink>,
        secret: Option<&str>,
    ) -> Result<Ready, NotReady> {
        let reference = ImageRef::parse(image).map_err(|message| {
            NotReady::Pull(PullError::Reference {
                image: image.to_owned(),
                message,
            })
        })?;
        let lookup = reference.pinned().unwrap_or_else(|| image.to_owned());
        let missing = || NotReady::Missing {
            remedy: missing_image_remedy(image, pull),
        };
        if pull != PullPolicy::Always || is_box_image(image) {
            match self.docker.inspect_image(&lookup).await {
                Ok(inspect) => {
                    let digest =
                        verify_digest(image, &reference, &inspect).map_err(NotReady::Pull)?;
                    return Ok(Ready { inspect, digest });
                }
                Err(error) if status_of(&error) == Some(404) => {
                    if pull == PullPolicy::Never || is_box_image(image) {
                        return Err(missing());
                    }
                }
                Err(error) => {
                    return Err(NotReady::Pull(PullError::Engine {
                        image: image.to_owned(),
                        doing: "inspecting the image".to_owned(),
                        message: engine_message(&error),
                    }));
                }
            }
        }
        self.pull_image(image, sink, secret)
            .await
            .map_err(NotReady::Pull)?;
        self.verified(image, &reference)
            .await
            .map_err(NotReady::Pull)
    }
}

/// The digest an image's envelope reports, checked against the pin: a pinned
/// image must carry `REPOSITORY@DIGEST` among its `RepoDigests`.
pub fn verify_digest(
    image: &str,
    reference: &ImageRef,
    inspect: &ImageInspect,
) -> Result<Option<String>, PullError> {
    let repo_digests = inspect.repo_digests.clone().unwrap_or_default();
    let repository = reference.familiar_repository();
    let ours: Vec<&str> = repo_digests
        .iter()
        .filter_map(|entry| entry.split_once('@'))
        .filter(|(repo, _)| familiar(repo) == repository)
        .map(|(_, digest)| digest)
        .collect();
    match &reference.digest {
        Some(pinned) if ours.contains(&pinned.as_str()) => Ok(Some(pinned.clone())),
        Some(pinned) => Err(PullError::Unverified {
            image: image.to_owned(),
            pinned: pinned.clone(),
            id: inspect.id.clone().unwrap_or_default(),
            found: repo_digests,
        }),
        None => Ok(ours.first().map(|digest| (*digest).to_owned())),
    }
}

fn registry_error(image: &str, registry: &str, error: &bollard::errors::Error) -> PullError {
    let message = engine_message(error);
    let lower = message.to_ascii_lowercase();
    // "unauthorized", "authentication required", "no basic auth credentials".
    let hint = if lower.contains("auth") || lower.contains("denied") {
        format!(
            " (box sends the unit's pull_secret when it names one, else the credentials `docker login {registry}` stored in the Docker config file's auths; credential helpers are not consulted)"
        )
    } else if lower.contains("manifest unknown") || lower.contains("not found") {
        " (the registry has no such tag or digest: check the name, or `docker manifest inspect` it)"
            .to_owned()
    } else {
        String::new()
    };
    PullError::Registry {
        image: image.to_owned(),
        registry: registry.to_owned(),
        message,
        hint,
    }
}

/// The Docker config file: `$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`.
fn docker_config_path() -> Option<std::path::PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(std::path::PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| std::path::PathBuf::from(home).join(".docker/config.json"))
}

/// The credentials the Docker config file holds for `registry`, if any.
/// Never logged: only whether some were found.
fn credentials_for(registry: &str) -> Option<DockerCredentials> {
    let path = docker_config_path()?;
    let text = std::fs::read_to_string(&path).ok()?;
    let found = credentials_in(&text, registry);
    tracing::debug!(
        registry,
        config = %path.display(),
        found = found.is_some(),
        "registry credentials"
    );
    found
}

/// The credentials in the host variable `name` (`user:password`, as
/// `docker login` takes them). Never logged; the session's redactor also
/// knows the value (`box-host`'s `session_secrets`).
fn credentials_from_secret(
    image: &str,
    registry: &str,
    name: &str,
) -> Result<DockerCredentials, PullError> {
    let refused = |problem| PullError::Secret {
        image: image.to_owned(),
        name: name.to_owned(),
        problem,
    };
    let value = std::env::var(name).map_err(|error| {
        refused(match error {
            std::env::VarError::NotPresent => "is not set in box's environment",
            std::env::VarError::NotUnicode(_) => "is not UTF-8",
        })
    })?;
    let (username, password) = value
        .split_once(':')
        .filter(|(user, password)| !user.is_empty() && !password.is_empty())
        .ok_or_else(|| refused("does not hold user:password"))?;
    Ok(DockerCredentials {
        username: Some(username.to_owned()),
        password: Some(password.to_owned()),
        serveraddress: Some(registry.to_owned()),
        ..DockerCredentials::default()
    })
}

/// The names a registry goes by in a config file's `auths`.
fn auth_keys(registry: &str) -> Vec<String> {
    let hosts: Vec<&str> = if registry == DEFAULT_REGISTRY {
        vec!["index.docker.io", "docker.io", "registry-1.docker.io"]
    } else {
        vec![registry]
    };
    let mut keys = Vec::new();
    for host in hosts {
        keys.push(host.to_owned());
        for scheme in ["https://", "http://"] {
            keys.push(format!("{scheme}{host}"));
            keys.push(format!("{scheme}{host}/v1/"));
            keys.push(format!("{scheme}{host}/v2/"));
        }
    }
    keys
}

/// The credentials for `registry` in a Docker config file's text (`auths`:
/// `auth` is base64 of `user:password`; or `identitytoken`).
pub fn credentials_in(text: &str, registry: &str) -> Option<DockerCredentials> {
    use base64::Engine as _;
    let config: serde_json::Value = serde_json::from_str(text).ok()?;
    let auths = config.get("auths")?.as_object()?;
    let entry = auth_keys(registry).iter().find_map(|key| auths.get(key))?;
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(serde_json::Value::as_str)
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
    };
    let (mut username, mut password) = (field("username"), field("password"));
    if let Some(auth) = field("auth") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (user, pass) = decoded.split_once(':')?;
        username = Some(user.to_owned());
        password = Some(pass.to_owned());
    }
    let identitytoken = field("identitytoken");
    if username.is_none() && identitytoken.is_none() {
        return None;
    }
    Some(DockerCredentials {
        username,
        password,
        identitytoken,
        serveraddress: Some(registry.to_owned()),
        ..DockerCredentials::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const OTHER: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn inspect(repo_digests: &[&str]) -> ImageInspect {
        ImageInspect {
            id: Some("sha256:1d".to_owned()),
            repo_digests: Some(repo_digests.iter().map(|d| (*d).to_owned()).collect()),
            ..ImageInspect::default()
        }
    }

    #[test]
    fn a_pinned_image_must_carry_its_digest() {
        let image = format!("localhost:5000/tool@{PINNED}");
        let reference = ImageRef::parse(&image).unwrap();
        let good = inspect(&[&format!("localhost:5000/tool@{PINNED}")]);
        assert_eq!(
            verify_digest(&image, &reference, &good).unwrap(),
            Some(PINNED.to_owned())
        );
        // The same digest under another repository is not this pin.
        let elsewhere = inspect(&[&format!("localhost:5000/other@{PINNED}")]);
        let error = verify_digest(&image, &reference, &elsewhere).unwrap_err();
        assert!(matches!(error, PullError::Unverified { .. }), "{error}");
        let wrong = inspect(&[&format!("localhost:5000/tool@{OTHER}")]);
        let message = verify_digest(&image, &reference, &wrong)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains(PINNED) && message.contains(OTHER),
            "names both digests: {message}"
        );
    }

    #[test]
    fn a_tag_reports_its_repositorys_digest_and_docker_hub_names_are_familiar() {
        let reference = ImageRef::parse("docker.io/library/rust:1.83").unwrap();
        let found = inspect(&[&format!("rust@{OTHER}")]);
        assert_eq!(
            verify_digest("rust:1.83", &reference, &found).unwrap(),
            Some(OTHER.to_owned())
        );
        let built = inspect(&[]);
        let local = ImageRef::parse("box-base:bookworm").unwrap();
        assert_eq!(
            verify_digest("box-base:bookworm", &local, &built).unwrap(),
            None
        );
    }

    #[test]
    fn credentials_come_from_the_config_files_auths() {
        // "user:s3cret" in base64.
        let config = r#"{"auths": {
            "localhost:5000": {"auth": "dXNlcjpzM2NyZXQ="},
            "https://index.docker.io/v1/": {"auth": "aHViOnB3"},
            "ghcr.io": {"identitytoken": "tok"}
        }, "credsStore": "desktop"}"#;
        let local = credentials_in(config, "localhost:5000").unwrap();
        assert_eq!(local.username.as_deref(), Some("user"));
        assert_eq!(local.password.as_deref(), Some("s3cret"));
        assert_eq!(local.serveraddress.as_deref(), Some("localhost:5000"));
        let hub = credentials_in(config, "docker.io").unwrap();
        assert_eq!(hub.username.as_deref(), Some("hub"));
        let token = credentials_in(config, "ghcr.io").unwrap();
        assert_eq!(token.identitytoken.as_deref(), Some("tok"));
        assert!(credentials_in(config, "quay.io").is_none());
        assert!(credentials_in("not json", "localhost:5000").is_none());
    }

    #[test]
    fn a_tally_counts_layers_and_bytes() {
        let event =
            |layer: &str, status: &str, current: Option<u64>, total: Option<u64>| PullEvent {
                image: "tool".to_owned(),
                layer: Some(layer.to_owned()),
                status: status.to_owned(),
                current,
                total,
            };
        let mut tally = PullTally::default();
        for e in [
            event("1.0", "Pulling from tool", None, None),
            event("a", "Already exists", None, None),
            event("b", "Pulling fs layer", None, None),
            event("b", "Downloading", Some(10), Some(100)),
            event("c", "Pulling fs layer", None, None),
        ] {
            tally.add(&e);
        }
        let summary = tally.summary();
        assert_eq!((summary.layers, summary.done, summary.existed), (3, 1, 1));
        assert_eq!((summary.downloaded, summary.to_download), (10, 100));
        tally.add(&event("b", "Download complete", None, None));
        tally.add(&event("b", "Extracting", Some(5), Some(100)));
        assert!(tally.summary().extracting);
        tally.add(&event("b", "Pull complete", None, None));
        let summary = tally.summary();
        assert_eq!((summary.done, summary.downloaded), (2, 100));
        assert!(!summary.extracting);
    }

    #[test]
    fn the_remedy_for_a_missing_image_follows_the_pull_policy() {
        let never = missing_image_remedy("rust:1.83", PullPolicy::Never);
        assert!(never.contains("\"never\""), "{never}");
        assert!(never.contains("box image pull rust:1.83"), "{never}");
        assert!(never.contains("docker pull rust:1.83"), "{never}");
        // The suite is the tag's: box image build makes box-base:bookworm
        // by default, so another suite's image needs --suite.
        assert_eq!(
            missing_image_remedy("box-base:bookworm", PullPolicy::Missing),
            "build it with `box image build --suite bookworm`"
        );
        assert_eq!(
            missing_image_remedy("box-base:trixie", PullPolicy::Missing),
            "build it with `box image build --suite trixie`"
        );
        assert_eq!(
            missing_image_remedy("box-rootfs:trixie", PullPolicy::Never),
            "build it with `box image build --suite trixie`"
        );
        assert_eq!(
            missing_image_remedy("box-dev:trixie", PullPolicy::Missing),
            "build it with `box image build --suite trixie && box image build dev --suite trixie`"
        );
        // A tag no build makes is said to be one.
        for image in [
            "box-base",
            "box-base:latest",
            "box-base:1.0",
            "box-base@sha256:ab",
        ] {
            let remedy = missing_image_remedy(image, PullPolicy::Missing);
            assert!(
                remedy.contains("only tagged by a Debian suite")
                    && remedy.contains("--suite SUITE")
                    && remedy.contains(image),
                "{remedy}"
            );
        }
        assert!(
            missing_image_remedy("box-fetch:v2", PullPolicy::Missing)
                .contains("builds only box-fetch:latest")
        );
        assert!(
            missing_image_remedy("box-test-musl:latest", PullPolicy::Never)
                .contains("scripts/test-images.sh")
        );
        assert!(
            missing_image_remedy("box-fetch:latest", PullPolicy::Missing)
                .contains("`box image build fetch`")
        );
        assert!(
            missing_image_remedy("box-dev:bookworm", PullPolicy::Missing)
                .contains("box image build dev --suite bookworm`")
        );
        assert!(is_box_image("box-fetch:latest"));
        assert!(is_box_image("box-dev:bookworm"));
        assert!(is_box_image("box-test-big:latest"));
        assert!(!is_box_image("localhost:5000/box-base:bookworm"));
    }
}
