//! A docker unit's home: an empty tmpfs of the unit's own, which the init
//! fills with what the image put there before the executor starts, so the
//! image's `~/.npmrc` or `~/.cargo/config.toml` stays in sight while the
//! home is writable on a read-only root.
//!
//! The host hands the image's home over as the engine's archive of it (a tar
//! of `./NAME` entries, read from the created container before it starts)
//! in the unit's run directory ([`crate::protocol::HOME_SEED`]). The init
//! unpacks it as the unit's user, with nothing more than the unit's own
//! rights: entries keep their modes and times, never their owners, and an
//! entry that would land outside the home (`..`, an absolute path, through a
//! link) is not unpacked.

use std::path::Path;

/// Unpack `seed` into `home`. A seed that is absent or empty is nothing to
/// unpack (an image without that directory). Returns how many entries were
/// unpacked.
pub fn seed(seed: &Path, home: &Path) -> Result<usize, String> {
    let file = match std::fs::File::open(seed) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(format!("opening {}: {error}", seed.display())),
    };
    let empty = file
        .metadata()
        .map_err(|error| format!("reading {}: {error}", seed.display()))?
        .len()
        == 0;
    if empty {
        return Ok(0);
    }
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_preserve_ownerships(false);
    archive.set_overwrite(true);
    let mut unpacked = 0;
    let entries = archive
        .entries()
        .map_err(|error| format!("reading {}: {error}", seed.display()))?;
    for entry in entries {
        let mut entry = entry.map_err(|error| format!("reading {}: {error}", seed.display()))?;
        // `unpack_in` refuses `..`, skips the root entry, and checks every
        // parent it writes through stays beneath the home.
        let path = entry.path().map(|path| path.display().to_string());
        match entry.unpack_in(home) {
            Ok(true) => unpacked += 1,
            Ok(false) => {
                tracing::warn!(entry = ?path, "box init: an entry of the image's home that would land outside it was not unpacked");
            }
            Err(error) => {
                return Err(format!(
                    "unpacking {} of the image's home into {}: {error}",
                    path.unwrap_or_default(),
                    home.display()
                ));
            }
        }
    }
    Ok(unpacked)
}

/// Link `home/relative` to `target` (a volume mounted elsewhere), making
/// the directories above it in the home as the unit's user. An empty
/// directory there (the image's) gives way; anything else is an error
/// naming it, since the volume would not be where the profile says.
pub fn link(home: &Path, relative: &Path, target: &Path) -> Result<(), String> {
    let at = home.join(relative);
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("making {}: {error}", parent.display()))?;
    }
    match std::fs::symlink_metadata(&at) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(format!("{}: {error}", at.display())),
        Ok(_) if std::fs::read_link(&at).is_ok_and(|pointed| pointed == target) => return Ok(()),
        Ok(metadata) if metadata.is_dir() => std::fs::remove_dir(&at).map_err(|error| {
            format!(
                "the image's home already holds {} ({error}), where a volume goes; move the volume or empty that directory in the image",
                at.display()
            )
        })?,
        Ok(_) => {
            return Err(format!(
                "the image's home already holds {}, where a volume goes; move the volume or remove it from the image",
                at.display()
            ));
        }
    }
    std::os::unix::fs::symlink(target, &at)
        .map_err(|error| format!("linking {} to {}: {error}", at.display(), target.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        builder
            .append_data(&mut dir, "./", std::io::empty())
            .unwrap();
        for (name, content) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o600);
            header.set_size(content.len() as u64);
            header.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut header, name, *content).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn the_images_home_is_unpacked_with_its_modes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let seed = dir.path().join("home.tar");
        std::fs::write(
            &seed,
            archive(&[
                ("./.npmrc", b"registry=https://npm.example.com/\n"),
                ("./.cargo/config.toml", b"[net]\n"),
            ]),
        )
        .unwrap();
        // The home itself, then its two files.
        assert_eq!(seed_home(&seed, &home), Ok(3));
        assert_eq!(
            std::fs::read_to_string(home.join(".npmrc")).unwrap(),
            "registry=https://npm.example.com/\n"
        );
        assert_eq!(
            std::fs::read_to_string(home.join(".cargo/config.toml")).unwrap(),
            "[net]\n"
        );
        let mode = std::fs::metadata(home.join(".npmrc"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    fn seed_home(seed: &Path, home: &Path) -> Result<usize, String> {
        super::seed(seed, home)
    }

    #[test]
    fn a_volume_is_linked_where_the_tools_look() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let volume = dir.path().join("volume");
        std::fs::create_dir_all(home.join(".cargo/registry")).unwrap();
        std::fs::create_dir(&volume).unwrap();
        for relative in [".cache/pip", ".cargo/registry"] {
            link(&home, Path::new(relative), &volume).unwrap();
            assert_eq!(std::fs::read_link(home.join(relative)).unwrap(), volume);
            // Again: already so.
            link(&home, Path::new(relative), &volume).unwrap();
        }
        std::fs::write(home.join(".npm"), b"a file").unwrap();
        let refused = link(&home, Path::new(".npm"), &volume).unwrap_err();
        assert!(refused.contains("already holds"), "{refused}");
    }

    #[test]
    fn no_seed_or_an_empty_one_is_nothing_to_unpack() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("home.tar");
        assert_eq!(seed_home(&seed, dir.path()), Ok(0));
        std::fs::write(&seed, b"").unwrap();
        assert_eq!(seed_home(&seed, dir.path()), Ok(0));
    }

    #[test]
    fn nothing_lands_outside_the_home() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let seed = dir.path().join("home.tar");
        // Built by hand: the builder itself refuses `..`.
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(3);
        header.set_entry_type(tar::EntryType::Regular);
        let name = b"./../escaped";
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(b"bad");
        bytes.resize(bytes.len() + 512 - 3, 0);
        bytes.extend_from_slice(&[0; 1024]);
        std::fs::write(&seed, bytes).unwrap();
        assert_eq!(seed_home(&seed, &home), Ok(0));
        assert!(!dir.path().join("escaped").exists());
    }
}
