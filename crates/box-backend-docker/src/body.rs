//! Pure translations between plan vocabulary and the engine's: a unit spec
//! becomes a container create body, an inspect reply becomes an envelope, an
//! ended container becomes a `UnitEnd`. No daemon, no clock, no environment:
//! everything they need comes in as arguments, so they are tested in
//! microseconds.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, HostConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountType, ResourcesUlimits,
};

use box_policy::executor::{ExecutorSpec, PlaceKind, SECRETS_DIR};

use box_backend::{EgressWiring, ObjectsWiring, SessionLabel, UnitWiring, labels};
use box_policy::plan::{MountMode, NetworkMode, TmpMode, UnitSpec, WorkspaceSource};

mod ended;
mod envelope;

pub use ended::{Ending, UnitEndParts, unit_end};
pub(crate) use envelope::listed_lease_ms;
pub use envelope::{add_executor_confinement, envelope_from_inspect};

/// Where the host's own `box` binary appears inside every unit (read-only).
pub const EXECUTOR_PATH: &str = "/.box/box";

/// How a unit's first process, box's own init (`/.box/box init`), is
/// started: it holds the unit's lease, relays the executor's stdio to the
/// host over the socket in `run_dir`, and is PID 1 (so images need nothing
/// of their own: a `FROM scratch` image runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitInit {
    /// The host directory holding the host's socket, mounted read-only at
    /// `box_init::protocol::UNIT_RUN_DIR` (the directory, never the socket
    /// file: a new host's socket must be seen there).
    pub run_dir: std::path::PathBuf,
    /// The init's arguments after `box init` (`InitConfig::to_args`).
    pub args: Vec<String>,
    /// The unit key, hex, for `box_init::protocol::KEY_ENV`.
    pub key: String,
    /// The unit's home: a tmpfs of its own there, which the init fills with
    /// what the image put there (`--home` in `args`).
    pub home: UnitHome,
    /// The unit's volumes (those beneath the home are linked there by the
    /// init: `--link` in `args`).
    pub volumes: Vec<UnitVolume>,
}

/// Where volumes beneath the home are mounted; the init links each into the
/// home (a mount point there would make the home's directories root's).
pub const VOLUMES_DIR: &str = "/.box/volumes";

/// A volume of a docker unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitVolume {
    /// The profile's volume.
    pub volume: box_policy::plan::Volume,
    /// The engine's named volume.
    pub engine_name: String,
    /// Where it is mounted in the unit.
    pub target: String,
    /// Where the unit's tools see it (the target, or its link in the home).
    pub seen_at: String,
    /// For a volume beneath the home: its place relative to the home.
    pub link: Option<std::path::PathBuf>,
}

impl UnitVolume {
    /// `volume`, stored in the engine's `engine_name`, for a unit whose home
    /// is `home`: beneath the home (`~/REL`, or an absolute path there) it is
    /// mounted at [`VOLUMES_DIR`] and linked; elsewhere it is mounted where
    /// the profile says.
    pub fn place(volume: &box_policy::plan::Volume, engine_name: String, home: &str) -> Self {
        use box_policy::plan::VolumePath;
        let relative = match &volume.path {
            VolumePath::Home(relative) => Some(relative.clone()),
            VolumePath::Absolute(path) => path
                .strip_prefix(home)
                .ok()
                .filter(|relative| relative.components().count() > 0)
                .map(Path::to_path_buf),
        };
        match relative {
            Some(relative) => Self {
                volume: volume.clone(),
                engine_name,
                target: format!("{VOLUMES_DIR}/{}", volume.name),
                seen_at: Path::new(home)
                    .join(&relative)
                    .to_string_lossy()
                    .into_owned(),
                link: Some(relative),
            },
            None => {
                let target = volume.path.to_string();
                Self {
                    volume: volume.clone(),
                    engine_name,
                    seen_at: target.clone(),
                    target,
                    link: None,
                }
            }
        }
    }
}

/// The envelope's volumes: each of `volumes` the engine mounted (`inspect`),
/// saying who shares it.
pub fn applied_volumes(
    volumes: &[UnitVolume],
    inspect: &ContainerInspectResponse,
    profile: &str,
) -> Vec<box_policy::envelope::AppliedVolume> {
    let mounted = inspect
        .host_config
        .as_ref()
        .and_then(|host| host.mounts.as_ref());
    volumes
        .iter()
        .filter(|unit| {
            mounted.into_iter().flatten().any(|mount| {
                mount.typ == Some(MountType::VOLUME)
                    && mount.source.as_deref() == Some(unit.engine_name.as_str())
                    && mount.target.as_deref() == Some(unit.target.as_str())
            })
        })
        .map(|unit| box_policy::envelope::AppliedVolume {
            name: unit.volume.name.clone(),
            path: unit.seen_at.clone(),
            scope: unit.volume.scope.as_str().to_owned(),
            shared_with: (unit.volume.scope == box_policy::plan::VolumeScope::Profile)
                .then(|| profile.to_owned()),
            id: unit.engine_name.clone(),
        })
        .collect()
}

/// A docker unit's home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitHome {
    /// Where it is mounted ([`home_path`]).
    pub path: String,
    /// Its owner: the unit's user where its ids are known; `None` (an
    /// image's user named, not numbered) makes it writable by every user of
    /// the unit instead (mode 1777).
    pub owner: Option<box_policy::plan::UserIds>,
    /// Its size.
    pub bytes: u64,
}

/// The options of the home's tmpfs: executable (tools install programs
/// there: `pip install --user`, `cargo install`), `nosuid`, `nodev`, sized
/// and inode-bounded like `/tmp`, private to the unit's user.
pub fn home_tmpfs_options(home: &UnitHome) -> String {
    let owner = match home.owner {
        Some(ids) => format!("mode=0700,uid={},gid={}", ids.uid, ids.gid),
        None => "mode=1777".to_owned(),
    };
    format!(
        "rw,nosuid,nodev,exec,size={},nr_inodes={},{owner}",
        home.bytes,
        tmpfs_inodes(home.bytes)
    )
}

/// The entrypoint of a unit: box's init from its mounted binary.
pub fn init_entrypoint(init: &UnitInit) -> Vec<String> {
    [EXECUTOR_PATH.to_owned(), "init".to_owned()]
        .into_iter()
        .chain(init.args.iter().cloned())
        .collect()
}

/// Seconds the engine waits after SIGTERM before SIGKILL when a unit stops.
/// Short: nothing in a unit needs a graceful shutdown once its session is gone.
pub const STOP_TIMEOUT_SECS: i64 = 2;

/// The command that builds the images a missing image error points at.
pub const BUILD_COMMAND: &str = "box image build";

/// Facts about the engine and kernel an envelope needs, gathered once per backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineFacts {
    /// The engine's version string.
    pub version: String,
    /// The API version negotiated.
    pub api_version: String,
    /// Whether the engine applies seccomp profiles (`docker info` SecurityOptions).
    pub seccomp: bool,
    /// The OCI runtimes registered with the engine: name → program path.
    pub runtimes: std::collections::BTreeMap<String, String>,
    /// Whether the engine remaps users into a user namespace (userns-remap).
    pub userns_remap: bool,
    /// "1" or "2".
    pub cgroup_version: String,
    /// The landlock ABI the host kernel offers (0 = none).
    pub landlock_abi: u32,
}

/// The container name of a unit: deterministic, so a duplicate start of the
/// same session's unit is refused by the engine (409) instead of making two.
pub fn container_name(session: &SessionLabel, spec: &UnitSpec) -> String {
    let raw = format!("box-{}-{}-{}", session.instance, session.session, spec.name);
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Docker names are bounded only loosely; keep them readable in `docker ps`.
    name.truncate(200);
    name
}

/// Refuse a workspace root the engine or the kernel would give meaning to
/// (C35: a working directory under /proc is an escape recipe).
pub fn check_root(root: &Path) -> Result<(), String> {
    if !root.is_absolute() {
        return Err(format!("{} is not an absolute path", root.display()));
    }
    let normal: Vec<_> = root
        .components()
        .filter(|c| !matches!(c, std::path::Component::RootDir))
        .collect();
    if normal
        .iter()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!("{} must not contain . or ..", root.display()));
    }
    let first = normal
        .first()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    if first.is_empty() || matches!(first.as_str(), "proc" | "sys" | "dev" | ".box") {
        return Err(format!(
            "{} is the root or under /proc, /sys, /dev or /.box; pick a plain directory such as /workspace",
            root.display()
        ));
    }
    Ok(())
}

/// The executor's command line inside a unit whose home is `home` and whose
/// volumes are mounted at `volumes`.
pub fn executor_argv(
    spec: &UnitSpec,
    wiring: &UnitWiring,
    home: &str,
    volumes: &[String],
) -> Vec<String> {
    std::iter::once(EXECUTOR_PATH.to_owned())
        .chain(unit_executor_spec(spec, wiring, home, volumes).to_args())
        .collect()
}

/// The executor's flags for a unit of `spec`, as [`executor_argv`] writes
/// them (and a pooled unit's bind line hands them over).
pub fn unit_executor_spec(
    spec: &UnitSpec,
    wiring: &UnitWiring,
    home: &str,
    volumes: &[String],
) -> ExecutorSpec {
    ExecutorSpec {
        reference: Some(spec.image.clone()),
        egress_socket: wiring
            .egress
            .as_ref()
            .map(|_| EgressWiring::socket_in_unit()),
        // The borrowed objects must stay readable under the executor's own
        // landlock layer, or the child's git could not read its history.
        read: wiring
            .objects
            .iter()
            .map(|_| ObjectsWiring::DIR_IN_UNIT.into())
            .collect(),
        // The unit's home: its tools write their configuration and caches
        // there (TMPDIR, /tmp, is the executor's own).
        write: std::iter::once(home)
            .chain(volumes.iter().map(String::as_str))
            .map(Into::into)
            .collect(),
        ..spec.executor_spec(&spec.root, PlaceKind::Container)
    }
}

impl EngineFacts {
    /// Whether `runtime` is gVisor (registered as `runsc`, or its program is).
    pub fn is_gvisor(&self, runtime: &str) -> bool {
        runtime == "runsc"
            || self
                .runtimes
                .get(runtime)
                .is_some_and(|path| path.ends_with("/runsc") || path == "runsc")
    }
}

/// The user string Docker takes (`uid:gid`), or `None` to keep the image's.
pub fn user_string(spec: &UnitSpec) -> Option<String> {
    spec.user.map(|ids| format!("{}:{}", ids.uid, ids.gid))
}

/// The engine's network mode for a plan's network. An `Egress` unit has no
/// network of its own either: only `lo`, and the host's proxy through its socket.
pub fn network_mode(mode: NetworkMode) -> &'static str {
    match mode {
        NetworkMode::None => "none",
        NetworkMode::Egress => "none",
        NetworkMode::Bridge => "bridge",
    }
}

/// Mount the host directory holding the unit's egress proxy socket, read-only, at
/// [`EgressWiring::DIR_IN_UNIT`].
pub fn mount_egress_socket(body: &mut ContainerCreateBody, socket_dir: &Path) {
    let host_config = body.host_config.get_or_insert_with(Default::default);
    host_config.mounts.get_or_insert_with(Vec::new).push(Mount {
        target: Some(EgressWiring::DIR_IN_UNIT.to_owned()),
        source: Some(socket_dir.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        bind_options: Some(private_bind()),
        ..Default::default()
    });
}

/// Mount each masked file, read-only, over its place in the workspace (docker
/// orders mounts by depth, so these go on top of the workspace's own mount).
/// Refuses a target that is not a plain relative path.
pub fn mount_masks(
    body: &mut ContainerCreateBody,
    root: &Path,
    masks: &[box_backend::FileMask],
) -> Result<(), String> {
    let host_config = body.host_config.get_or_insert_with(Default::default);
    let mounts = host_config.mounts.get_or_insert_with(Vec::new);
    for mask in masks {
        let plain = mask.target.components().count() > 0
            && mask
                .target
                .components()
                .all(|part| matches!(part, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!(
                "the masked file {} is not a plain path inside the workspace",
                mask.target.display()
            ));
        }
        mounts.push(Mount {
            target: Some(root.join(&mask.target).to_string_lossy().into_owned()),
            source: Some(mask.source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            bind_options: Some(private_bind()),
            ..Default::default()
        });
    }
    Ok(())
}

/// Mount a `worktree` fork's borrowed git objects (the parent's objects
/// directory), read-only, at [`ObjectsWiring::DIR_IN_UNIT`].
pub fn mount_objects(body: &mut ContainerCreateBody, objects: &Path) {
    let host_config = body.host_config.get_or_insert_with(Default::default);
    host_config.mounts.get_or_insert_with(Vec::new).push(Mount {
        target: Some(ObjectsWiring::DIR_IN_UNIT.to_owned()),
        source: Some(objects.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        bind_options: Some(private_bind()),
        ..Default::default()
    });
}

/// The home of a unit whose image names none that can be used.
pub const DEFAULT_HOME: &str = "/home/box";

/// Where the unit's home is mounted (a tmpfs holding what the image put
/// there): the image's `HOME`, unless that is no place for a mount of the
/// unit's own (the root, not absolute or clean, under `/proc`, `/sys`,
/// `/dev`, `/.box`, `/tmp` or `/run/secrets`, or overlapping the workspace,
/// whose host directory must never get a mount point made in it); then
/// [`DEFAULT_HOME`] (or `/.home` where the workspace is there).
pub fn home_path(image_env: &[String], root: &Path) -> String {
    let usable = |home: &Path| {
        check_root(home).is_ok()
            && !home.starts_with("/tmp")
            && !home.starts_with(SECRETS_DIR)
            && !home.starts_with(root)
            && !root.starts_with(home)
    };
    let image = image_env
        .iter()
        .find_map(|entry| entry.strip_prefix("HOME="))
        .map(|home| home.trim_end_matches('/'))
        .filter(|home| usable(Path::new(home)));
    match image {
        Some(home) => home.to_owned(),
        None if usable(Path::new(DEFAULT_HOME)) => DEFAULT_HOME.to_owned(),
        None => "/.home".to_owned(),
    }
}

/// The proxy address a unit's tools are pointed at.
pub const EGRESS_PROXY_URL: &str = "http://127.0.0.1:3128";

/// What every session network's name starts with.
pub const SESSION_NETWORK_PREFIX: &str = "box-net-";

/// The engine network of `session`'s bridge units: `box-net-` and the instance and
/// session, made safe for the engine's names and bounded.
pub fn session_network(session: &SessionLabel) -> String {
    let mut name = format!(
        "{SESSION_NETWORK_PREFIX}{}-{}",
        box_backend::safe_name(&session.instance),
        box_backend::safe_name(&session.session)
    );
    name.truncate(120);
    name
}

/// One inode per 4 KiB of the size bound (at least 1024): as many small files
/// as the space could hold, and no more.
pub fn tmpfs_inodes(size_bytes: u64) -> u64 {
    (size_bytes / 4096).max(1024)
}

/// The options of a unit's tmpfs of `size_bytes`, mounted `mode` (rw or
/// ro), executable or not: the engine mounts a tmpfs `noexec` unless told
/// `exec`, so the word is always written.
fn tmpfs_options(mode: &str, exec: TmpMode, size_bytes: u64) -> String {
    format!(
        "{mode},nosuid,nodev,{},size={size_bytes},nr_inodes={},mode=1777",
        exec.as_str(),
        tmpfs_inodes(size_bytes)
    )
}

/// Whether a tmpfs's `options` (as the engine reports them back) let
/// programs run: only an explicit `exec` does, since the engine adds
/// `noexec` to every tmpfs that does not say `exec`.
pub fn tmpfs_exec(options: &str) -> TmpMode {
    // The last word wins, as in mount(8).
    options
        .split(',')
        .filter_map(|word| match word.trim() {
            "exec" => Some(TmpMode::Exec),
            "noexec" => Some(TmpMode::NoExec),
            _ => None,
        })
        .next_back()
        .unwrap_or(TmpMode::NoExec)
}

/// The most bytes of the secrets tmpfs: values come from environment
/// variables, which the kernel bounds well below this.
pub const SECRETS_TMPFS_BYTES: u64 = 1 << 20;

/// The options of the tmpfs at `/run/secrets`: the executor (the unit's
/// user) writes each secret there as a 0400 file before it serves; mode
/// 0700 and owned by the unit's user, so no other user in the unit lists or
/// reads them. Not on disk, gone with the container; `noexec` since nothing
/// there is a program. An image user (`user = "image"`) keeps the engine's
/// owner, root: the executor then runs as the image's user and must be root
/// to write there.
pub fn secrets_tmpfs_options(spec: &UnitSpec) -> String {
    let owner = spec
        .user
        .map(|ids| format!(",uid={},gid={}", ids.uid, ids.gid))
        .unwrap_or_default();
    format!("rw,nosuid,nodev,noexec,size={SECRETS_TMPFS_BYTES},nr_inodes=1024,mode=0700{owner}")
}

/// The create body for one unit: every hardening setting, with the reason.
///
/// `exe` is the host path of the static `box` binary mounted as the executor;
/// `created` is the RFC 3339 creation time for the label; `env` is the unit's
/// environment, already resolved (set values and passed host values).
pub fn container_body(
    session: &SessionLabel,
    spec: &UnitSpec,
    exe: &Path,
    created: &str,
    env: &[(String, String)],
    init: &UnitInit,
) -> ContainerCreateBody {
    let labels = HashMap::from([
        (labels::INSTANCE.to_owned(), session.instance.clone()),
        (labels::SESSION.to_owned(), session.session.clone()),
        (labels::UNIT.to_owned(), spec.name.clone()),
        (labels::PROFILE.to_owned(), session.profile.clone()),
        (labels::CREATED.to_owned(), created.to_owned()),
        (
            labels::LEASE_MS.to_owned(),
            spec.lease.as_millis().to_string(),
        ),
        (labels::IMAGE.to_owned(), spec.image.clone()),
    ]);

    let mut mounts = vec![Mount {
        // The executor: the host's own static binary, read-only, so any image
        // works without a rebuild and the unit cannot alter it.
        target: Some(EXECUTOR_PATH.to_owned()),
        source: Some(exe.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        bind_options: Some(private_bind()),
        ..Default::default()
    }];
    // Size- and inode-limited, nosuid, nodev. Executable unless the profile
    // says `[security] tmp = "noexec"`: the workspace is writable and
    // executable anyway, so noexec here would only break compilers and test
    // runners that build into /tmp. Empty files cost no size, so without an
    // inode bound only the memory limit (minutes of slow reclaim, then the
    // OOM killer's choice) would stop a D47 inode flood.
    let mut tmpfs = HashMap::from([(
        "/tmp".to_owned(),
        tmpfs_options("rw", spec.security.tmp, spec.limits.tmp_bytes),
    )]);
    match &spec.source {
        WorkspaceSource::Host(path) => mounts.push(Mount {
            target: Some(spec.root.to_string_lossy().into_owned()),
            source: Some(path.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(spec.mode == MountMode::ReadOnly),
            // CIS 5.20 / C39: no mount propagation in either direction.
            bind_options: Some(private_bind()),
            ..Default::default()
        }),
        WorkspaceSource::Empty => {
            // A fresh directory that lives and dies with the unit; bounded like /tmp.
            let ro = match spec.mode {
                MountMode::ReadOnly => "ro",
                MountMode::ReadWrite => "rw",
            };
            // Executable, as a host workspace is.
            tmpfs.insert(
                spec.root.to_string_lossy().into_owned(),
                tmpfs_options(ro, TmpMode::Exec, spec.limits.tmp_bytes),
            );
        }
        WorkspaceSource::None => {}
    }
    if !spec.env_secrets.is_empty() {
        tmpfs.insert(SECRETS_DIR.to_owned(), secrets_tmpfs_options(spec));
    }
    // A writable home on a read-only root, bounded, the unit's user's; its
    // init fills it with the image's before anything else runs.
    tmpfs.insert(init.home.path.clone(), home_tmpfs_options(&init.home));
    // Volumes: storage that outlives the unit, each the engine's named
    // volume (bound to box's own directory for it), never propagating.
    for volume in &init.volumes {
        mounts.push(Mount {
            target: Some(volume.target.clone()),
            source: Some(volume.engine_name.clone()),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            volume_options: Some(bollard::models::MountVolumeOptions {
                no_copy: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    // The init's run directory: the host's socket, read-only (the socket is
    // connectable; nothing can be created beside it).
    mounts.push(Mount {
        target: Some(box_init::protocol::UNIT_RUN_DIR.to_owned()),
        source: Some(init.run_dir.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        bind_options: Some(private_bind()),
        ..Default::default()
    });

    let memory = clamp_i64(spec.limits.memory_bytes);
    let nofile = clamp_i64(spec.limits.nofile);
    let host_config = HostConfig {
        // box's init is PID 1 (it reaps and forwards signals itself).
        init: Some(false),
        // Drop everything, add back only the plan's reviewed list.
        cap_drop: Some(vec!["ALL".to_owned()]),
        cap_add: (!spec.security.capabilities.is_empty())
            .then(|| spec.security.capabilities.clone()),
        // The engine's default seccomp profile stays on: asking for nothing
        // about seccomp keeps it; only no-new-privileges is added.
        security_opt: Some(vec!["no-new-privileges:true".to_owned()]),
        readonly_rootfs: Some(spec.security.read_only_root),
        privileged: Some(false),
        tmpfs: Some(tmpfs),
        mounts: Some(mounts),
        memory: Some(memory),
        // Equal to memory: no swap, so a memory bomb is OOM-killed, not a swap storm.
        memory_swap: Some(memory),
        nano_cpus: Some(nano_cpus(spec.limits.cpus)),
        pids_limit: Some(clamp_i64(spec.limits.pids)),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".to_owned()),
            soft: Some(nofile),
            hard: Some(nofile),
        }]),
        // A bridge unit joins its session's own network: units of one session
        // reach each other, units of other sessions (on theirs) do not.
        network_mode: Some(match spec.network.mode {
            NetworkMode::Bridge => session_network(session),
            mode => network_mode(mode).to_owned(),
        }),
        runtime: spec.runtime.clone(),
        // Gone as soon as it ends: a unit whose host died ends when its
        // lease lapses and leaves nothing, with no box process anywhere.
        // No restart policy: never restarted behind the host's back.
        auto_remove: Some(true),
        ..Default::default()
    };

    ContainerCreateBody {
        image: Some(spec.image.clone()),
        // box's init, which starts the executor; the image's entrypoint and
        // command never run (an image may still shape the executor's
        // environment via ENV). An entrypoint given drops the image's CMD.
        entrypoint: Some(init_entrypoint(init)),
        cmd: None,
        user: user_string(spec),
        working_dir: Some(spec.root.to_string_lossy().into_owned()),
        // The unit key is in the configuration (`docker inspect` shows it to
        // whoever may use the engine anyway); the init keeps it from every
        // child. The log format: the init's and the executor's stderr are
        // JSON lines the host re-emits with their fields.
        env: Some(
            env.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .chain([
                    format!("{}={}", box_init::protocol::KEY_ENV, init.key),
                    "BOX_LOG_FORMAT=json".to_owned(),
                ])
                .collect(),
        ),
        labels: Some(labels),
        // Hostname names the unit, not the host.
        hostname: Some(truncate_hostname(&spec.name)),
        stop_timeout: Some(STOP_TIMEOUT_SECS),
        tty: Some(false),
        open_stdin: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Apply what a profile's operator explicitly allowed (privileged, shared
/// host namespaces, host devices) to a built body's host config. Plans only
/// carry these when the operator switch was on; an unknown namespace name is
/// an error naming it, never ignored.
pub fn operator_allowances(
    host: &mut HostConfig,
    privileged: bool,
    host_namespaces: &[String],
    devices: &[std::path::PathBuf],
) -> Result<(), String> {
    if privileged {
        host.privileged = Some(true);
    }
    for namespace in host_namespaces {
        match namespace.as_str() {
            "pid" => host.pid_mode = Some("host".to_owned()),
            "ipc" => host.ipc_mode = Some("host".to_owned()),
            "uts" => host.uts_mode = Some("host".to_owned()),
            "net" | "network" => host.network_mode = Some("host".to_owned()),
            "cgroup" => {
                host.cgroupns_mode = Some(bollard::models::HostConfigCgroupnsModeEnum::HOST);
            }
            "user" => host.userns_mode = Some("host".to_owned()),
            other => {
                return Err(format!(
                    "host namespace `{other}` is not one of pid, ipc, uts, net, cgroup, user"
                ));
            }
        }
    }
    if !devices.is_empty() {
        host.devices = Some(
            devices
                .iter()
                .map(|path| bollard::models::DeviceMapping {
                    path_on_host: Some(path.to_string_lossy().into_owned()),
                    path_in_container: Some(path.to_string_lossy().into_owned()),
                    cgroup_permissions: Some("rwm".to_owned()),
                })
                .collect(),
        );
    }
    Ok(())
}

fn private_bind() -> MountBindOptions {
    MountBindOptions {
        propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
        ..Default::default()
    }
}

pub(crate) fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// CPUs as the engine's nano-CPUs (1e9 per core); at least one nano-CPU.
pub fn nano_cpus(cpus: f64) -> i64 {
    let nanos = (cpus * 1e9).round();
    if nanos.is_finite() && nanos >= 1.0 {
        // Truncation is fine: the value is finite and positive, and far below i64::MAX
        // for any real machine; absurd values saturate.
        nanos.min(i64::MAX as f64) as i64
    } else {
        1
    }
}

pub(crate) fn truncate_hostname(name: &str) -> String {
    let mut host: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    host.truncate(63);
    if host.is_empty() {
        "unit".to_owned()
    } else {
        host
    }
}

#[cfg(test)]
pub(crate) mod tests {

    use std::path::PathBuf;
    use std::time::Duration;

    use pretty_assertions::assert_eq;

    use super::*;
    use box_backend::{Hardening, OomEvidence};
    use box_policy::plan::{Limits, Requirement, Security, UserIds};

    fn session() -> SessionLabel {
        SessionLabel {
            instance: "inst1".to_owned(),
            session: "s1".to_owned(),
            profile: "default".to_owned(),
        }
    }

    /// A fully hardened workspace unit spec for tests.
    pub(crate) fn spec() -> UnitSpec {
        UnitSpec {
            user: Some(UserIds {
                uid: 1000,
                gid: 1000,
            }),
            limits: Limits {
                memory_bytes: 512 << 20,
                cpus: 1.5,
                pids: 128,
                tmp_bytes: 64 << 20,
                home_bytes: 64 << 20,
                nofile: 1024,
                call_timeout: Duration::from_secs(60),
                idle: Duration::from_secs(60),
                lifetime: Duration::from_secs(600),
                // The rest (the start deadline) as a shipped profile has them.
                ..Limits::default()
            },
            security: Security {
                landlock: Requirement::BestEffort,
                ..Security::strict()
            },
            ..UnitSpec::workspace(
                "box-base:bookworm",
                WorkspaceSource::Host(PathBuf::from("/srv/ws")),
            )
        }
    }

    fn init() -> UnitInit {
        UnitInit {
            run_dir: PathBuf::from("/run/box/units/u1"),
            args: [
                "--socket",
                "/.box/run/host.sock",
                "--unit",
                "i/s1/workspace",
                "--lease-ms",
                "30000",
                "--home",
                "/home/box",
                "--",
                "/.box/box",
                "execute",
            ]
            .map(str::to_owned)
            .to_vec(),
            key: "k".repeat(64),
            home: UnitHome {
                path: "/home/box".to_owned(),
                owner: Some(box_policy::plan::UserIds {
                    uid: 1000,
                    gid: 1000,
                }),
                bytes: 32 << 20,
            },
            volumes: Vec::new(),
        }
    }

    fn body() -> ContainerCreateBody {
        container_body(
            &session(),
            &spec(),
            Path::new("/usr/local/bin/box"),
            "2026-01-01T00:00:00Z",
            &[("LANG".to_owned(), "C.UTF-8".to_owned())],
            &init(),
        )
    }

    #[test]
    fn hardening_is_all_in_the_body() {
        let body = body();
        let host = body.host_config.clone().unwrap_or_default();
        // box's init is PID 1, and the unit goes as soon as it ends.
        assert_eq!(host.init, Some(false));
        assert_eq!(host.auto_remove, Some(true));
        assert_eq!(host.restart_policy, None);
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(host.cap_add, None);
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges:true".to_owned()])
        );
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.privileged, Some(false));
        assert_eq!(host.memory, Some(512 << 20));
        assert_eq!(host.memory_swap, Some(512 << 20));
        assert_eq!(host.nano_cpus, Some(1_500_000_000));
        assert_eq!(host.pids_limit, Some(128));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(
            host.tmpfs.unwrap_or_default().get("/tmp").cloned(),
            Some(format!(
                "rw,nosuid,nodev,exec,size={},nr_inodes={},mode=1777",
                64 << 20,
                (64 << 20) / 4096
            ))
        );
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(body.cmd, None);
        let entrypoint = body.entrypoint.clone().unwrap_or_default();
        assert_eq!(entrypoint[..2], ["/.box/box", "init"]);
        assert_eq!(entrypoint[2..], init().args[..]);
        assert_eq!(
            body.env,
            Some(vec![
                "LANG=C.UTF-8".to_owned(),
                format!("BOX_UNIT_KEY={}", "k".repeat(64)),
                "BOX_LOG_FORMAT=json".to_owned(),
            ])
        );
    }

    #[test]
    fn secrets_get_a_private_tmpfs_and_the_executor_their_names_only() {
        let mut unit = spec();
        assert!(
            !body()
                .host_config
                .unwrap_or_default()
                .tmpfs
                .unwrap_or_default()
                .contains_key(SECRETS_DIR),
            "no secrets, no tmpfs"
        );
        unit.env_secrets = vec!["DEPLOY_KEY".to_owned(), "GH_TOKEN".to_owned()];
        unit.env_secrets_as_env = vec!["GH_TOKEN".to_owned()];
        let body = container_body(
            &session(),
            &unit,
            Path::new("/usr/local/bin/box"),
            "2026-01-01T00:00:00Z",
            &[],
            &init(),
        );
        let tmpfs = body
            .host_config
            .unwrap_or_default()
            .tmpfs
            .unwrap_or_default();
        assert_eq!(
            tmpfs.get(SECRETS_DIR).map(String::as_str),
            Some("rw,nosuid,nodev,noexec,size=1048576,nr_inodes=1024,mode=0700,uid=1000,gid=1000")
        );
        let argv = executor_argv(&unit, &UnitWiring::default(), "/home/box", &[]);
        let at = argv.iter().position(|arg| arg == "--secrets").unwrap();
        assert_eq!(argv[at + 1], "DEPLOY_KEY,GH_TOKEN:env");
        // The values are never part of the body.
        let env = body.env.unwrap_or_default();
        assert!(
            env.iter()
                .all(|entry| !entry.contains("DEPLOY_KEY") && !entry.contains("GH_TOKEN")),
            "{env:?}"
        );
    }

    #[test]
    fn only_the_workspace_the_executor_and_the_run_directory_are_mounted() {
        let mounts = body()
            .host_config
            .and_then(|h| h.mounts)
            .unwrap_or_default();
        let seen: Vec<_> = mounts
            .iter()
            .map(|m| {
                (
                    m.source.clone().unwrap_or_default(),
                    m.target.clone().unwrap_or_default(),
                    m.read_only,
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (
                    "/usr/local/bin/box".to_owned(),
                    EXECUTOR_PATH.to_owned(),
                    Some(true)
                ),
                ("/srv/ws".to_owned(), "/workspace".to_owned(), Some(false)),
                (
                    "/run/box/units/u1".to_owned(),
                    "/.box/run".to_owned(),
                    Some(true)
                ),
            ]
        );
    }

    #[test]
    fn read_only_mode_and_empty_and_no_workspace() {
        let mut ro = spec();
        ro.mode = MountMode::ReadOnly;
        let body = container_body(&session(), &ro, Path::new("/b"), "t", &[], &init());
        let mounts = body.host_config.and_then(|h| h.mounts).unwrap_or_default();
        assert_eq!(mounts.get(1).and_then(|m| m.read_only), Some(true));

        let mut empty = spec();
        empty.source = WorkspaceSource::Empty;
        let body = container_body(&session(), &empty, Path::new("/b"), "t", &[], &init());
        let host = body.host_config.unwrap_or_default();
        assert_eq!(host.mounts.map(|m| m.len()), Some(2));
        assert!(host.tmpfs.unwrap_or_default().contains_key("/workspace"));

        let mut none = spec();
        none.source = WorkspaceSource::None;
        let body = container_body(&session(), &none, Path::new("/b"), "t", &[], &init());
        let host = body.host_config.unwrap_or_default();
        assert_eq!(host.mounts.map(|m| m.len()), Some(2));
        // /tmp and the home.
        assert_eq!(host.tmpfs.map(|t| t.len()), Some(2));
    }

    #[test]
    fn a_listed_units_lease_is_its_label_else_its_inits_command_line() {
        assert_eq!(listed_lease_ms(Some("2000"), None), Some(2000));
        assert_eq!(
            listed_lease_ms(
                None,
                Some(
                    "/.box/box init --socket /.box/run/unit.sock --unit u --lease-ms 7000 -- /.box/box execute"
                )
            ),
            Some(7000)
        );
        assert_eq!(listed_lease_ms(Some("junk"), Some("sleep infinity")), None);
        assert_eq!(listed_lease_ms(None, None), None);
    }

    #[test]
    fn labels_and_name_identify_the_unit() {
        let labels = body().labels.unwrap_or_default();
        let mut pairs: Vec<_> = labels.into_iter().collect();
        pairs.sort();
        assert_eq!(
            pairs,
            vec![
                ("box.created".to_owned(), "2026-01-01T00:00:00Z".to_owned()),
                ("box.image".to_owned(), spec().image),
                ("box.instance".to_owned(), "inst1".to_owned()),
                ("box.lease-ms".to_owned(), "30000".to_owned()),
                ("box.profile".to_owned(), "default".to_owned()),
                ("box.session".to_owned(), "s1".to_owned()),
                ("box.unit".to_owned(), "workspace".to_owned()),
            ]
        );
        let mut odd = spec();
        odd.name = "my server/1".to_owned();
        assert_eq!(container_name(&session(), &odd), "box-inst1-s1-my_server_1");
    }

    #[test]
    fn capabilities_and_bridge_follow_the_plan() {
        let mut s = spec();
        s.security.capabilities = vec!["NET_BIND_SERVICE".to_owned()];
        s.network.mode = NetworkMode::Bridge;
        s.security.read_only_root = false;
        let host = container_body(&session(), &s, Path::new("/b"), "t", &[], &init())
            .host_config
            .unwrap_or_default();
        assert_eq!(host.cap_add, Some(vec!["NET_BIND_SERVICE".to_owned()]));
        assert_eq!(host.network_mode.as_deref(), Some("box-net-inst1-s1"));
        assert_eq!(host.readonly_rootfs, Some(false));
    }

    #[test]
    fn executor_argv_carries_root_kind_ref_and_passes() {
        let mut s = spec();
        s.env_pass = vec!["A".to_owned(), "B".to_owned()];
        s.security.write_guard = false;
        assert_eq!(
            executor_argv(&s, &UnitWiring::default(), "/home/box", &[]),
            [
                "/.box/box",
                "execute",
                "--root",
                "/workspace",
                "--kind",
                "container",
                "--ref",
                "box-base:bookworm",
                "--pass-env",
                "A,B",
                "--write-guard",
                "off",
                "--write",
                "/home/box"
            ]
            .map(str::to_owned)
            .to_vec()
        );
    }

    fn facts() -> EngineFacts {
        EngineFacts {
            version: "20.10".to_owned(),
            api_version: "1.41".to_owned(),
            seccomp: true,
            runtimes: Default::default(),
            userns_remap: false,
            cgroup_version: "2".to_owned(),
            landlock_abi: 3,
        }
    }

    /// Issue 23, item 2: `/tmp` says `exec` (the engine would add `noexec`
    /// to a tmpfs that does not), or `noexec` when the profile asks; an
    /// empty workspace is executable as a host one is.
    #[test]
    fn tmp_is_mounted_exec_unless_the_plan_says_noexec() {
        let options = |spec: &UnitSpec| {
            let body = container_body(
                &session(),
                spec,
                Path::new("/usr/local/bin/box"),
                "2025-01-01T00:00:00Z",
                &[],
                &init(),
            );
            body.host_config.unwrap().tmpfs.unwrap()
        };
        let mut spec = spec();
        spec.source = WorkspaceSource::Empty;
        let tmpfs = options(&spec);
        assert_eq!(tmpfs_exec(&tmpfs["/tmp"]), TmpMode::Exec);
        assert_eq!(tmpfs_exec(&tmpfs["/workspace"]), TmpMode::Exec);
        spec.security.tmp = TmpMode::NoExec;
        let tmpfs = options(&spec);
        assert_eq!(tmpfs_exec(&tmpfs["/tmp"]), TmpMode::NoExec);
        for word in ["nosuid", "nodev"] {
            assert!(tmpfs["/tmp"].split(',').any(|o| o == word), "{tmpfs:?}");
        }
        // Read back: only an explicit `exec` is executable.
        assert_eq!(tmpfs_exec("rw,nosuid,size=1"), TmpMode::NoExec);
        assert_eq!(tmpfs_exec("noexec,exec"), TmpMode::Exec);
    }

    #[test]
    fn envelope_reads_back_what_the_engine_applied() {
        let body = body();
        let inspect = ContainerInspectResponse {
            id: Some("abc".to_owned()),
            image: Some("sha256:1".to_owned()),
            config: Some(bollard::models::ContainerConfig {
                user: body.user.clone(),
                entrypoint: body.entrypoint.clone(),
                ..Default::default()
            }),
            host_config: body.host_config.clone(),
            ..Default::default()
        };
        let envelope = envelope_from_inspect(
            &spec(),
            &inspect,
            "1000:1000",
            &facts(),
            vec!["LANG".to_owned()],
            Vec::new(),
        );
        assert_eq!(envelope.id, "abc");
        // The lease is read back from the init's command line.
        assert_eq!(
            envelope.lifecycle,
            Some(box_backend::AppliedLifecycle { lease_ms: 30_000 })
        );
        assert_eq!(envelope.image_id, "sha256:1");
        assert_eq!(envelope.user, "1000:1000");
        assert_eq!(
            envelope.hardening,
            Hardening {
                capabilities: Vec::new(),
                no_new_privileges: true,
                read_only_root: true,
                seccomp: "default".to_owned(),
                landlock_abi: 3,
                landlock_enforced: false,
                namespaces: ["mount", "pid", "net", "ipc", "uts", "cgroup"]
                    .map(str::to_owned)
                    .to_vec(),
                user_namespace: false,
                tmp: Some(TmpMode::Exec),
            }
        );
        assert_eq!(
            serde_json::to_value(&envelope.limits).unwrap(),
            serde_json::json!({
                "memoryBytes": 512 << 20, "memorySwapBytes": 512 << 20, "cpus": 1.5,
                "pids": 128, "tmpBytes": 64 << 20, "tmpInodes": (64 << 20) / 4096,
                "homeBytes": 32 << 20,
                "nofile": 1024,
            })
        );
        assert_eq!(
            serde_json::to_value(&envelope.network).unwrap(),
            serde_json::json!({"mode": "none", "allow": []})
        );
    }

    #[test]
    fn the_executor_adds_its_seccomp_layer_and_a_required_landlock() {
        let inspect = ContainerInspectResponse::default();
        let mut required = spec();
        required.security.landlock = Requirement::Required;
        let mut envelope = envelope_from_inspect(&required, &inspect, "", &facts(), vec![], vec![]);
        let engine = envelope.hardening.seccomp.clone();
        add_executor_confinement(&mut envelope, &required);
        assert_eq!(envelope.hardening.seccomp, format!("{engine}+box"));
        assert!(envelope.hardening.landlock_enforced);

        let mut best_effort = spec();
        best_effort.security.landlock = Requirement::BestEffort;
        let mut envelope =
            envelope_from_inspect(&best_effort, &inspect, "", &facts(), vec![], vec![]);
        envelope.hardening.seccomp = "none".to_owned();
        add_executor_confinement(&mut envelope, &best_effort);
        assert_eq!(envelope.hardening.seccomp, "box");
        assert!(!envelope.hardening.landlock_enforced);
    }

    #[test]
    fn envelope_does_not_claim_what_was_not_applied() {
        let inspect = ContainerInspectResponse {
            host_config: Some(HostConfig {
                security_opt: Some(vec!["seccomp=unconfined".to_owned()]),
                readonly_rootfs: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        };
        let envelope = envelope_from_inspect(&spec(), &inspect, "", &facts(), vec![], vec![]);
        assert_eq!(envelope.lifecycle, None, "no init, no lease");
        assert_eq!(envelope.user, "0:0");
        assert_eq!(envelope.hardening.seccomp, "none");
        assert!(!envelope.hardening.no_new_privileges);
        assert!(!envelope.hardening.read_only_root);
        assert_eq!(
            envelope.hardening.capabilities,
            vec!["<engine default set>".to_owned()]
        );
    }

    #[test]
    fn each_end_is_described_once_with_its_cause() {
        let check = |ending, code, oom, want: &str| {
            let reason = unit_end("ws", ending, code, oom, 1024).reason;
            assert_eq!(reason, want);
            assert!(
                reason.matches("exit code").count() <= 1 && reason.matches("code").count() <= 1,
                "the exit is described more than once: {reason}"
            );
        };
        check(
            Ending::Container,
            Some(137),
            OomEvidence::Killed,
            "unit ws was killed by the kernel's OOM killer at its memory limit of 1024 bytes: it chose box's init, the unit's first process, and the unit ended with it; exit code 137",
        );
        check(
            Ending::Terminated,
            Some(143),
            OomEvidence::NotKilled,
            "unit ws was stopped: its init got SIGTERM or SIGINT (`docker stop`, or a signal from outside the unit); exit code 143",
        );
        check(
            Ending::LeaseLapsed { lease_ms: 3000 },
            Some(75),
            OomEvidence::NotKilled,
            "unit ws ended because its lease lapsed: its host did not renew it within 3s (the host was stopped, hung or too busy); exit code 75",
        );
        check(
            Ending::Executor,
            Some(3),
            OomEvidence::Killed,
            "the executor of unit ws exited with code 3 after the kernel's OOM killer killed a process in the unit at its memory limit of 1024 bytes",
        );
        check(
            Ending::Container,
            Some(137),
            OomEvidence::NotKilled,
            "unit ws was killed with SIGKILL from outside (`docker kill`, or `docker stop` past its grace; not the OOM killer; exit code 137)",
        );
        check(
            Ending::Container,
            Some(143),
            OomEvidence::NotKilled,
            "unit ws was stopped: its init got SIGTERM (`docker stop`, or a signal from outside the unit; exit code 143)",
        );
        check(
            Ending::Executor,
            Some(137),
            OomEvidence::NotKilled,
            "the executor of unit ws was killed with SIGKILL while its unit ran on (not the OOM killer; exit code 137)",
        );
        check(
            Ending::Executor,
            Some(139),
            OomEvidence::NotKilled,
            "the executor of unit ws was killed by signal 11 (SIGSEGV; exit code 139)",
        );
        check(
            Ending::Container,
            Some(3),
            OomEvidence::NotKilled,
            "unit ws exited with code 3",
        );
        check(
            Ending::Executor,
            Some(0),
            OomEvidence::NotKilled,
            "the executor of unit ws exited normally (code 0)",
        );
        check(
            Ending::Gone,
            None,
            OomEvidence::NotKilled,
            "unit ws is gone (removed, or the engine lost it)",
        );
        // Issue 22, item 6: the executor's own OOM kill is told from the init's.
        check(
            Ending::Executor,
            Some(137),
            OomEvidence::Killed,
            "the executor of unit ws was killed by the kernel's OOM killer at its memory limit of 1024 bytes; exit code 137",
        );
        // Where the unit's cgroup could not be read, a SIGKILL says so.
        check(
            Ending::Container,
            Some(137),
            OomEvidence::Unknown,
            "unit ws was killed with SIGKILL: from outside (`docker kill`, or `docker stop` past its grace) or by the kernel's OOM killer, which box cannot tell here (the unit's memory cgroup was not readable from this host; exit code 137)",
        );
        check(
            Ending::Executor,
            Some(137),
            OomEvidence::Unknown,
            "the executor of unit ws was killed with SIGKILL while its unit ran on (by the kernel's OOM killer or from inside the unit, which box cannot tell here: the unit's memory cgroup was not readable from this host; exit code 137)",
        );
        check(
            Ending::Gone,
            None,
            OomEvidence::Killed,
            "unit ws was killed by the kernel's OOM killer at its memory limit of 1024 bytes: it chose box's init, the unit's first process, and the unit ended with it",
        );
        assert_eq!(
            unit_end("ws", Ending::Gone, None, OomEvidence::Unknown, 1).oom_killed,
            None
        );
    }

    #[test]
    fn roots_under_kernel_trees_are_refused() {
        for (root, ok) in [
            ("/workspace", true),
            ("/home/box/src", true),
            ("/", false),
            ("workspace", false),
            ("/proc/self/fd/7", false),
            ("/sys/x", false),
            ("/dev", false),
            ("/.box", false),
            ("/workspace/../proc", false),
        ] {
            assert_eq!(check_root(Path::new(root)).is_ok(), ok, "{root}");
        }
    }

    #[test]
    fn operator_allowances_apply_only_what_was_allowed() {
        let mut host = body().host_config.unwrap_or_default();
        let before = host.clone();
        operator_allowances(&mut host, false, &[], &[]).unwrap();
        assert_eq!(host, before);
        operator_allowances(
            &mut host,
            true,
            &["pid".to_owned(), "net".to_owned()],
            &[PathBuf::from("/dev/fuse")],
        )
        .unwrap();
        assert_eq!(host.privileged, Some(true));
        assert_eq!(host.pid_mode.as_deref(), Some("host"));
        assert_eq!(host.network_mode.as_deref(), Some("host"));
        assert_eq!(host.devices.map(|d| d.len()), Some(1));
        let error = operator_allowances(
            &mut body().host_config.unwrap_or_default(),
            false,
            &["mnt".to_owned()],
            &[],
        );
        assert!(error.unwrap_err().contains("`mnt`"));
        // The envelope then tells the truth about it.
        let inspect = ContainerInspectResponse {
            host_config: Some(HostConfig {
                privileged: Some(true),
                pid_mode: Some("host".to_owned()),
                ..body().host_config.unwrap_or_default()
            }),
            ..Default::default()
        };
        let envelope = envelope_from_inspect(&spec(), &inspect, "", &facts(), vec![], vec![]);
        assert_eq!(envelope.hardening.seccomp, "none");
        assert!(!envelope.hardening.namespaces.contains(&"pid".to_owned()));
    }

    #[test]
    fn nano_cpus_saturate_and_floor() {
        assert_eq!(nano_cpus(2.0), 2_000_000_000);
        assert_eq!(nano_cpus(0.0), 1);
        assert_eq!(nano_cpus(f64::NAN), 1);
    }
}
