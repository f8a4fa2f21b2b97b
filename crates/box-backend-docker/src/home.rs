//! A unit's home on a read-only root: a tmpfs of its own (`body`), which the
//! unit's init fills with what the image put at that path before anything
//! of the unit runs (`box_init::home`). This module gets the image's home to
//! the init: the engine's archive of that path, read from the created (not
//! yet started) container, where the tmpfs is not mounted yet, so the
//! archive is the image's content. Reading it costs the engine a mount of
//! the container's root (about 100 ms), so it is read once per image and
//! home path and kept in the host's runtime directory (`home-seeds`,
//! private to the host's user); each unit gets it as
//! [`box_init::protocol::HOME_SEED`] in its run directory (a hard link,
//! readable by the unit's user). An image without that directory gets an
//! empty seed: nothing to unpack.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use bollard::Docker;
use futures::StreamExt as _;
use sha2::Digest as _;

/// Seeds larger than this are not kept between units (the runtime
/// directory is often memory); they are read again for each unit.
const KEEP_AT_MOST: u64 = 16 << 20;

/// What a unit's home is filled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seeded {
    /// What the image put there.
    Image,
    /// Nothing: the image has no such directory, or an empty one.
    Nothing,
}

/// Put the image's home (`image_id`, `home`) in `run_dir` for the init of
/// `container` (created, not started), read through `docker` or from the
/// seeds kept in `runtime_dir`. Refused when the archive is larger than
/// `limit` (the home's size), naming `limits.home`.
pub(crate) async fn seed(
    docker: &Docker,
    container: &str,
    (image_id, home): (&str, &str),
    runtime_dir: &Path,
    run_dir: &Path,
    limit: u64,
) -> Result<Seeded, String> {
    let target = run_dir.join(box_init::protocol::HOME_SEED);
    let kept = kept_path(runtime_dir, image_id, home);
    if let Ok(metadata) = std::fs::metadata(&kept) {
        if metadata.len() > limit {
            return Err(too_large(home, metadata.len(), limit));
        }
        place(&kept, &target)?;
        return Ok(if metadata.len() == 0 {
            Seeded::Nothing
        } else {
            Seeded::Image
        });
    }
    let archive = read_archive(docker, container, home, limit).await?;
    let seeded = if archive.is_empty() {
        Seeded::Nothing
    } else {
        Seeded::Image
    };
    if (archive.len() as u64) <= KEEP_AT_MOST && keep(&kept, &archive).is_ok() {
        place(&kept, &target)?;
    } else {
        write_new(&target, &archive)?;
    }
    Ok(seeded)
}

fn too_large(home: &str, bytes: u64, limit: u64) -> String {
    format!(
        "the image's home {home} holds {} in the engine's archive, more than the unit's home may (limits.home = {}); raise limits.home in the profile",
        box_policy::profile::ByteSize(bytes),
        box_policy::profile::ByteSize(limit)
    )
}

/// Where the seed of `image_id`'s `home` is kept.
fn kept_path(runtime_dir: &Path, image_id: &str, home: &str) -> PathBuf {
    let mut digest = sha2::Sha256::new();
    digest.update(image_id.as_bytes());
    digest.update([0]);
    digest.update(home.as_bytes());
    runtime_dir
        .join("home-seeds")
        .join(format!("{}.tar", hex::encode(digest.finalize())))
}

/// The engine's archive of `home` in `container` (`HOME/.`: entries named
/// `./NAME`), empty when the image has no such directory; at most `limit`
/// bytes.
async fn read_archive(
    docker: &Docker,
    container: &str,
    home: &str,
    limit: u64,
) -> Result<Vec<u8>, String> {
    let options = bollard::query_parameters::DownloadFromContainerOptionsBuilder::new()
        .path(&format!("{}/.", home.trim_end_matches('/')))
        .build();
    let mut stream = docker.download_from_container(container, Some(options));
    let mut archive = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => {
                archive.extend_from_slice(&bytes);
                if archive.len() as u64 > limit {
                    return Err(too_large(home, archive.len() as u64, limit));
                }
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(Vec::new()),
            Err(error) => {
                return Err(format!(
                    "reading the image's home {home} from the engine: {error}"
                ));
            }
        }
    }
    Ok(archive)
}

/// Keep `archive` at `kept` (written beside it, then renamed: a reader never
/// sees half of one).
fn keep(kept: &Path, archive: &[u8]) -> Result<(), String> {
    let dir = kept.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|error| format!("{}: {error}", dir.display()))?;
    let partial = dir.join(format!(".{:016x}.partial", rand::random::<u64>()));
    write_new(&partial, archive)?;
    std::fs::rename(&partial, kept).map_err(|error| {
        let _ = std::fs::remove_file(&partial);
        format!("{}: {error}", kept.display())
    })
}

/// Write `bytes` to a new file at `path`, readable by the unit's user (the
/// image's own content: nothing the unit could not read in its image).
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|error| format!("{}: {error}", path.display()))?;
    file.write_all(bytes)
        .map_err(|error| format!("{}: {error}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .map_err(|error| format!("{}: {error}", path.display()))
}

/// The kept seed in a unit's run directory: a hard link (same file system),
/// else a copy.
fn place(kept: &Path, target: &Path) -> Result<(), String> {
    if std::fs::hard_link(kept, target).is_ok() {
        return Ok(());
    }
    let bytes = std::fs::read(kept).map_err(|error| format!("{}: {error}", kept.display()))?;
    write_new(target, &bytes)
}
