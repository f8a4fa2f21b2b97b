//! The unit's mount namespace: the host hidden, its own paths bound back,
//! its volumes, home, secrets and ptys, the host's root-only files covered.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::wire::{
    AppliedHomeReport, AppliedVolumeReport, Report, SandboxSpec, SpecHome, SpecNetwork, SpecTmp,
};
use super::{failed, refused};

/// Where `/etc/resolv.conf` really is, when a unit on the host's network
/// needs it and it lies outside the system directories.
pub(super) fn resolver_target(network: SpecNetwork) -> Option<PathBuf> {
    match network {
        SpecNetwork::None => None,
        SpecNetwork::Host => std::fs::canonicalize("/etc/resolv.conf")
            .ok()
            .filter(|target| !target.starts_with("/etc")),
    }
}

/// Top-level directories a unit sees as they are: the system it reads (see
/// `sandbox::SYSTEM_READ_PATHS`), and the kernel's own file systems.
pub(super) const SHOWN_TOP_LEVEL: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "proc", "sys", "dev",
];

/// In the unit's mount namespace, put an empty tmpfs over every other
/// top-level directory of the host (`/home`, `/root`, `/run`, `/tmp`, `/var`,
/// `/work`, ...), then bind the unit's own paths (`keep`: workspace, temp
/// directory, executables) back at the same place. Landlock already denies
/// reading and writing there, but before landlock ABI 9 it cannot stop a
/// `connect` to a Unix socket by path: the Docker socket, an SSH agent, D-Bus
/// (C37, F69, G80). What is not there cannot be reached. A kept path that is
/// itself a top-level directory stays in sight whole. Returns the hidden
/// directories, those that could not be hidden with why, and whether the
/// host's `/tmp` became the unit's own (`tmp`: a writable, sized tmpfs in
/// place of the empty one).
pub(super) fn hide_host(
    keep: &[PathBuf],
    tmp: Option<SpecTmp>,
) -> std::io::Result<(Vec<String>, Vec<String>, bool)> {
    use nix::mount::MsFlags;
    use std::os::unix::fs::OpenOptionsExt;
    let mut keep: Vec<PathBuf> = keep
        .iter()
        .filter_map(|path| std::fs::canonicalize(path).ok())
        .collect();
    if keep.iter().any(|path| path.parent().is_none()) {
        // The unit keeps `/` itself (an operator allowed the host's root as
        // the workspace): there is nothing to hide, and the envelope says so.
        return Ok((
            Vec::new(),
            vec!["/: the unit's workspace is the host's root".to_owned()],
            false,
        ));
    }
    keep.sort();
    keep.dedup();
    // A path beneath another kept path comes back with it.
    let keep: Vec<PathBuf> = keep
        .iter()
        .filter(|path| {
            !keep
                .iter()
                .any(|other| other != *path && path.starts_with(other))
        })
        .cloned()
        .collect();
    let mut hidden = Vec::new();
    for entry in std::fs::read_dir("/")? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Symbolic links (`/bin -> usr/bin`) lead to shown or hidden places alike.
        if !entry.file_type()?.is_dir() || SHOWN_TOP_LEVEL.contains(&name) {
            continue;
        }
        let top = PathBuf::from("/").join(name);
        // A top-level directory the unit keeps whole (the workspace is
        // `/tmp`, say) stays in sight: a tmpfs over it would hide the very
        // path that must come back, with nothing above it to bind it under.
        if keep.contains(&top) {
            continue;
        }
        hidden.push(top);
    }
    // Handles on what comes back, taken before it is hidden.
    let mut restore = Vec::new();
    for path in &keep {
        if hidden.iter().any(|top| path.starts_with(top)) {
            let handle = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(path)?;
            restore.push((path.clone(), handle, path.is_dir()));
        }
    }
    // A directory that refuses the tmpfs (an automount, say) stays in sight,
    // and the envelope says so.
    let mut unhidden = Vec::new();
    let mut tmp_mounted = false;
    hidden.retain(|top| {
        // The host's /tmp becomes the unit's own: sized, writable by every
        // user of the unit (sticky), executable unless the profile says not.
        let own_tmp = tmp.filter(|_| top == Path::new("/tmp"));
        let (flags, options) = match own_tmp {
            Some(tmp) => (
                if tmp.exec {
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV
                } else {
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC
                },
                format!(
                    "mode=1777,size={},nr_inodes={}",
                    tmp.bytes,
                    (tmp.bytes / 4096).max(1024)
                ),
            ),
            None => (
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                "mode=0755,size=1m".to_owned(),
            ),
        };
        let mounted = nix::mount::mount(
            Some("tmpfs"),
            top,
            Some("tmpfs"),
            flags,
            Some(options.as_str()),
        );
        match mounted {
            Ok(()) => {
                tmp_mounted |= own_tmp.is_some();
                true
            }
            Err(errno) => {
                unhidden.push(format!("{}: {errno}", top.display()));
                false
            }
        }
    });
    restore.retain(|(path, _, _)| hidden.iter().any(|top| path.starts_with(top)));
    for (path, handle, is_dir) in &restore {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if *is_dir {
            std::fs::create_dir(path)?;
        } else {
            File::create(path)?;
        }
        use std::os::fd::AsRawFd;
        let source = format!("/proc/self/fd/{}", handle.as_raw_fd());
        nix::mount::mount(
            Some(source.as_str()),
            path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )?;
    }
    let hidden = hidden
        .iter()
        .map(|path| path.display().to_string())
        .collect();
    Ok((hidden, unhidden, tmp_mounted))
}

/// Bind `path` onto itself (whether or not [`hide_host`] already bound it
/// back: it stays in sight where no tmpfs covers it), then make that mount
/// read-only.
pub(super) fn bind_read_only(path: &Path) -> std::io::Result<()> {
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )?;
    nix::mount::mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )?;
    Ok(())
}

/// Close the volumes' locks in a forked child of the helper without
/// unlocking them (a lock's drop would unlock it for the helper too: the
/// two share it), so nothing of the unit holds them.
pub(super) fn let_go_in_child(locks: Vec<nix::fcntl::Flock<File>>) {
    use std::os::fd::AsRawFd as _;
    for lock in locks {
        let fd = lock.as_raw_fd();
        std::mem::forget(lock);
        let _ = nix::unistd::close(fd);
    }
}

/// A volume's directory, taken while it can be reached.
pub(super) enum VolumeSource {
    /// A detached copy of its mount ([`clone_tree`]), from any mount
    /// namespace.
    Tree(OwnedFd),
    /// A handle on it in the unit's mount namespace, bound from
    /// `/proc/self/fd` (kernels or sandboxes without `open_tree`).
    Handle(OwnedFd),
}

impl VolumeSource {
    /// `path`, in the unit's own mount namespace.
    pub(super) fn take(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        match clone_tree(path) {
            Ok(tree) => Ok(Self::Tree(tree)),
            Err(_) => {
                let handle = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(path)?;
                Ok(Self::Handle(OwnedFd::from(handle)))
            }
        }
    }

    /// Mount it at `target`, in this process's mount namespace.
    fn attach(&self, target: &Path) -> std::io::Result<()> {
        match self {
            Self::Tree(tree) => attach_tree(tree, target),
            Self::Handle(handle) => {
                use std::os::fd::AsRawFd as _;
                let source = format!("/proc/self/fd/{}", handle.as_raw_fd());
                nix::mount::mount(
                    Some(source.as_str()),
                    target,
                    None::<&str>,
                    nix::mount::MsFlags::MS_BIND | nix::mount::MsFlags::MS_REC,
                    None::<&str>,
                )?;
                Ok(())
            }
        }
    }
}

/// A detached copy of the mount at `path` (`open_tree` with
/// `OPEN_TREE_CLONE`), attached elsewhere later with [`attach_tree`]: taken
/// where `path` can be reached, attached where the unit sees it.
pub(super) fn clone_tree(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd as _;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: open_tree (which nix does not wrap) with a NUL-terminated path
    // that outlives the call; it returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from(std::io::ErrorKind::Other))?;
    // SAFETY: a new fd this process owns and nothing else holds.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attach the detached mount `tree` at `target` (`move_mount`), in this
/// process's mount namespace.
pub(super) fn attach_tree(tree: &OwnedFd, target: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    let target = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let empty = c"";
    // SAFETY: move_mount (which nix does not wrap) with a held fd and
    // NUL-terminated paths that outlive the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Put each of the unit's volumes at its place. In the unit's own mount
/// namespace its directory is mounted there; the mount point is made as the
/// unit's user (the home keeps its owner) beneath the unit's home or a host
/// directory the namespace replaced, and never on the host's own file
/// system (an existing directory elsewhere is mounted over; anything else
/// is refused, naming the volume). Without a mount namespace, a place
/// beneath the unit's home becomes a link to the volume's directory on the
/// host (which the unit's user must reach), and any other place is refused.
pub(super) fn attach_volumes(
    spec: &SandboxSpec,
    trees: Vec<Option<VolumeSource>>,
    mount_namespace: bool,
    hidden: &[String],
) -> Result<Vec<AppliedVolumeReport>, Report> {
    let home = spec.home.as_ref().map(|home| home.path.as_path());
    let beneath_home =
        |target: &Path| home.is_some_and(|home| target.starts_with(home) && target != home);
    let mut made = Vec::new();
    for (volume, tree) in spec.volumes.iter().zip(trees) {
        let control = format!("volume {:?}", volume.name);
        let target = &volume.target;
        if mount_namespace {
            let Some(tree) = tree else {
                return Err(failed(
                    format!("taking volume {}'s directory", volume.name),
                    "no copy of its mount was made",
                ));
            };
            let inside_hidden = hidden
                .iter()
                .any(|top| target.starts_with(top) && target != Path::new(top));
            if !target.is_dir() {
                if !beneath_home(target) && !inside_hidden {
                    return Err(refused(
                        &control,
                        format!(
                            "{} does not exist, and its mount point would be made on the host's file system (only beneath the unit's home or a host directory the unit's mount namespace replaced: {})",
                            target.display(),
                            hidden.join(", ")
                        ),
                    ));
                }
                std::fs::create_dir_all(target).map_err(|error| {
                    failed(
                        format!(
                            "creating volume {}'s place {}",
                            volume.name,
                            target.display()
                        ),
                        error,
                    )
                })?;
            }
            tree.attach(target).map_err(|error| {
                failed(
                    format!("mounting volume {} at {}", volume.name, target.display()),
                    error,
                )
            })?;
            made.push(AppliedVolumeReport {
                name: volume.name.clone(),
                linked: false,
            });
            continue;
        }
        if !beneath_home(target) {
            return Err(refused(
                &control,
                format!(
                    "the unit has no mount namespace of its own, so nothing can be mounted at {}; a volume beneath the home (~/...) is linked instead",
                    target.display()
                ),
            ));
        }
        let reachable = nix::unistd::access(
            &volume.data,
            nix::unistd::AccessFlags::R_OK
                | nix::unistd::AccessFlags::W_OK
                | nix::unistd::AccessFlags::X_OK,
        );
        if let Err(errno) = reachable {
            return Err(refused(
                &control,
                format!(
                    "the unit has no mount namespace of its own, and its user cannot reach the volume's directory {} to link it ({errno})",
                    volume.data.display()
                ),
            ));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|error| failed(format!("creating {}", parent.display()), error))?;
        }
        std::os::unix::fs::symlink(&volume.data, target).map_err(|error| {
            failed(
                format!("linking volume {} at {}", volume.name, target.display()),
                error,
            )
        })?;
        made.push(AppliedVolumeReport {
            name: volume.name.clone(),
            linked: true,
        });
    }
    Ok(made)
}

/// Make the unit's home: a tmpfs of `home.bytes` over its directory where
/// the unit has a mount namespace of its own (private, executable: tools
/// install programs there), then `home.skel` copied in.
pub(super) fn make_home(
    home: &SpecHome,
    mount_namespace: bool,
) -> Result<AppliedHomeReport, Report> {
    use nix::mount::MsFlags;
    let mut bytes = None;
    if mount_namespace {
        nix::mount::mount(
            Some("tmpfs"),
            &home.path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(
                format!(
                    "mode=0700,size={},nr_inodes={}",
                    home.bytes,
                    (home.bytes / 4096).max(1024)
                )
                .as_str(),
            ),
        )
        .map_err(|errno| {
            failed(
                format!("mounting the unit's home at {}", home.path.display()),
                errno,
            )
        })?;
        bytes = Some(home.bytes);
    }
    let mut seeded_from = None;
    if let Some(skel) = home.skel.as_ref().filter(|skel| skel.is_dir()) {
        copy_tree(skel, &home.path, 0).map_err(|error| {
            failed(
                format!("filling the unit's home from {}", skel.display()),
                error,
            )
        })?;
        seeded_from = Some(skel.clone());
    }
    Ok(AppliedHomeReport { bytes, seeded_from })
}

/// Copy the directories, regular files (with their modes) and symbolic links
/// beneath `from` into `to`; anything else is left out, and so is what lies
/// deeper than a skeleton ever does.
pub(super) fn copy_tree(from: &Path, to: &Path, depth: usize) -> std::io::Result<()> {
    if depth > 16 {
        return Ok(());
    }
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&target)?;
            copy_tree(&entry.path(), &target, depth + 1)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The most bytes of the secrets tmpfs (as on the docker backend).
pub(super) const SECRETS_TMPFS_BYTES: u64 = 1 << 20;

/// Mount a tmpfs of the unit's own at `dir` (mode 0700, owned by the unit's
/// user, which this process is by now), where box's executor writes each
/// secret as a 0400 file. Only inside a top-level directory that
/// [`hide_host`] replaced with the unit's own tmpfs: creating the mount point
/// must never touch the host's file system. Returns whether it mounted.
pub(super) fn mount_secrets(dir: &Path, hidden: &[String]) -> Result<bool, Report> {
    use nix::mount::MsFlags;
    let inside_hidden = hidden
        .iter()
        .any(|top| dir.starts_with(top) && dir != Path::new(top));
    if !inside_hidden {
        return Err(refused(
            "env.secrets",
            format!(
                "{} is not inside a directory the unit's mount namespace replaced (hidden: {}), so its mount point would be made on the host",
                dir.display(),
                hidden.join(", ")
            ),
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|error| failed(format!("creating {}", dir.display()), error))?;
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=0700,size={SECRETS_TMPFS_BYTES},nr_inodes=1024").as_str()),
    )
    .map_err(|errno| failed(format!("mounting a tmpfs at {}", dir.display()), errno))?;
    Ok(true)
}

/// Cover each of `paths`: a directory with an empty read-only tmpfs, anything
/// else with `/dev/null`. Returns how many were covered.
pub(super) fn conceal(paths: &[PathBuf]) -> std::io::Result<usize> {
    use nix::mount::MsFlags;
    let mut covered = 0;
    for path in paths {
        let Ok(metadata) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if metadata.file_type().is_symlink() {
            continue;
        }
        if metadata.is_dir() {
            nix::mount::mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=0000,size=4k"),
            )?;
        } else {
            nix::mount::mount(
                Some("/dev/null"),
                path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )?;
        }
        covered += 1;
    }
    Ok(covered)
}

/// The kernel files Docker masks in every container (its `MaskedPaths`),
/// those this machine has: kernel memory, keys, timers and firmware tables
/// that a unit has no business reading (C33). Under a `/sys` of the unit's
/// own (`fresh_sys`) nothing is mounted on `/sys/kernel/debug`, so it needs
/// no mask (one mount fewer).
pub(super) fn kernel_paths(fresh_sys: bool) -> Vec<PathBuf> {
    [
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/sys/firmware",
        "/sys/kernel/debug",
    ]
    .into_iter()
    .filter(|path| !(fresh_sys && *path == "/sys/kernel/debug"))
    .map(PathBuf::from)
    .filter(|path| path.symlink_metadata().is_ok())
    .collect()
}

/// Give the unit a devpts instance of its own, so `/dev/pts` shows only its
/// own pseudo-terminals and never the host's terminals. Returns whether it
/// could.
pub(super) fn mount_own_ptys() -> bool {
    use nix::mount::MsFlags;
    let devpts = nix::mount::mount(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    );
    devpts.is_ok()
        && nix::mount::mount(
            Some("/dev/pts/ptmx"),
            "/dev/ptmx",
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .is_ok()
}
