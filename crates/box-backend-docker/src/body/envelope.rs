//! A started unit's envelope, from what the engine reports it applied
//! (its inspect reply), never from what was asked.

use bollard::models::ContainerInspectResponse;

use box_backend::{
    AppliedLimits, AppliedNetwork, BackendKind, ContainerLimits, EgressWiring, Envelope, Hardening,
    UnitState,
};
use box_policy::plan::{NetworkMode, Requirement, UnitSpec};

use super::{EGRESS_PROXY_URL, EXECUTOR_PATH, EngineFacts, SESSION_NETWORK_PREFIX, tmpfs_exec};

/// The envelope of a started unit, from what the engine reports it applied
/// (`inspect`), never from what was asked.
///
/// `image_user` is the image's configured user (used when the container's is
/// empty); `env_passed` and `env_scrubbed` are the variable names the start
/// resolved.
pub fn envelope_from_inspect(
    spec: &UnitSpec,
    inspect: &ContainerInspectResponse,
    image_user: &str,
    facts: &EngineFacts,
    env_passed: Vec<String>,
    env_scrubbed: Vec<String>,
) -> Envelope {
    let host = inspect.host_config.clone().unwrap_or_default();
    let config = inspect.config.clone().unwrap_or_default();
    let lifecycle = config.entrypoint.as_deref().and_then(applied_lease);
    // The home the init was told to fill, where a tmpfs of the unit's own is.
    let home = config
        .entrypoint
        .as_deref()
        .and_then(init_config)
        .and_then(|config| config.home)
        .map(|path| path.to_string_lossy().into_owned())
        .filter(|path| {
            host.tmpfs
                .as_ref()
                .is_some_and(|tmpfs| tmpfs.contains_key(path))
        });
    let home_bytes = home
        .as_ref()
        .and_then(|path| host.tmpfs.as_ref()?.get(path))
        .and_then(|options| tmpfs_option(options, "size"));
    let user = config
        .user
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| image_user.to_owned());
    let user = normalise_user(&user);
    let uid_is_root = user
        .split(':')
        .next()
        .is_some_and(|uid| uid == "0" || uid == "root");

    let security_opt = host.security_opt.clone().unwrap_or_default();
    let no_new_privileges = security_opt.iter().any(|o| {
        o == "no-new-privileges" || o == "no-new-privileges:true" || o == "no-new-privileges=true"
    });
    let seccomp_unconfined = security_opt
        .iter()
        .any(|o| o == "seccomp=unconfined" || o == "seccomp:unconfined");
    // gVisor's kernel does not apply the engine's seccomp profile to an exec'd
    // process, offers no landlock, and does not enforce a tmpfs inode bound
    // (docs/gvisor.md): nothing of those is claimed for it.
    let runtime = host.runtime.clone().unwrap_or_else(|| "runc".to_owned());
    let gvisor = facts.is_gvisor(&runtime);
    let seccomp = if !facts.seccomp || seccomp_unconfined || host.privileged == Some(true) || gvisor
    {
        "none"
    } else if security_opt.iter().any(|o| o.starts_with("seccomp")) {
        "box"
    } else {
        "default"
    };

    let cap_drop = host.cap_drop.clone().unwrap_or_default();
    let dropped_all = cap_drop.iter().any(|c| c.eq_ignore_ascii_case("ALL"));
    // A non-root process under runc gets an empty effective set whatever the
    // bounding set is (no ambient capabilities are granted); root keeps what
    // was not dropped.
    let capabilities = if !uid_is_root {
        Vec::new()
    } else if host.privileged == Some(true) {
        vec!["<all: privileged>".to_owned()]
    } else if dropped_all {
        host.cap_add.clone().unwrap_or_default()
    } else {
        vec!["<engine default set>".to_owned()]
    };

    let network_mode = host.network_mode.clone().unwrap_or_default();
    let mut namespaces = vec!["mount".to_owned()];
    for (name, mode) in [
        ("pid", host.pid_mode.as_deref()),
        ("net", Some(network_mode.as_str())),
        ("ipc", host.ipc_mode.as_deref()),
        ("uts", host.uts_mode.as_deref()),
    ] {
        if mode != Some("host") {
            namespaces.push(name.to_owned());
        }
    }
    let cgroupns_private = match host.cgroupns_mode {
        Some(bollard::models::HostConfigCgroupnsModeEnum::PRIVATE) => true,
        Some(bollard::models::HostConfigCgroupnsModeEnum::HOST) => false,
        // The engine's default: private on cgroup v2, host on v1.
        _ => facts.cgroup_version == "2",
    };
    if cgroupns_private {
        namespaces.push("cgroup".to_owned());
    }
    let user_namespace = facts.userns_remap && host.userns_mode.as_deref() != Some("host");
    if user_namespace {
        namespaces.push("user".to_owned());
    }

    let tmp_options = host.tmpfs.as_ref().and_then(|t| t.get("/tmp"));
    let tmp_bytes = tmp_options.and_then(|opts| tmpfs_option(opts, "size"));
    let tmp_inodes = tmp_options
        .and_then(|opts| tmpfs_option(opts, "nr_inodes"))
        .filter(|_| !gvisor);
    let nofile = host.ulimits.as_ref().and_then(|u| {
        u.iter()
            .find(|l| l.name.as_deref() == Some("nofile"))
            .and_then(|l| l.hard)
    });
    let limits = AppliedLimits::Container(ContainerLimits {
        memory_bytes: host.memory,
        memory_swap_bytes: host.memory_swap,
        cpus: host.nano_cpus.map(|n| n as f64 / 1e9),
        pids: host.pids_limit,
        tmp_bytes,
        tmp_inodes,
        home_bytes,
        nofile,
        start_timeout_ms: None,
    });
    // Egress is what the engine applied (no network) plus the proxy's socket,
    // as mounted; without both it is reported as the engine's mode.
    let egress_mounted = host.mounts.iter().flatten().any(|mount| {
        mount.target.as_deref() == Some(EgressWiring::DIR_IN_UNIT) && mount.read_only == Some(true)
    });
    let egress =
        spec.network.mode == NetworkMode::Egress && network_mode == "none" && egress_mounted;
    let session_network = network_mode
        .starts_with(SESSION_NETWORK_PREFIX)
        .then(|| network_mode.clone());
    let network = AppliedNetwork {
        mode: if egress {
            "egress".to_owned()
        } else if session_network.is_some() {
            "bridge".to_owned()
        } else {
            network_mode
        },
        session_network,
        allow: if egress {
            spec.network.allow.iter().map(ToString::to_string).collect()
        } else {
            Vec::new()
        },
        proxy: egress.then(|| EGRESS_PROXY_URL.to_owned()),
        egress_limits: egress.then_some(box_policy::envelope::EgressLimits {
            max_connections: spec.network.max_connections,
            bytes_per_second: spec.network.bytes_per_second,
        }),
        local_none: None,
    };

    let state = inspect
        .state
        .as_ref()
        .and_then(|s| s.status)
        .map_or(UnitState::Unknown, |s| UnitState::from_engine(s.as_ref()));

    Envelope {
        name: spec.name.clone(),
        role: spec.role,
        backend: BackendKind::Docker,
        id: inspect.id.clone().unwrap_or_default(),
        image: spec.image.clone(),
        image_id: inspect.image.clone().unwrap_or_default(),
        // The backend sets it from the image it verified.
        image_digest: None,
        runtime: Some(runtime),
        userland: None,
        root: spec.root.to_string_lossy().into_owned(),
        user,
        network,
        limits,
        hardening: Hardening {
            capabilities,
            no_new_privileges,
            read_only_root: host.readonly_rootfs == Some(true),
            seccomp: seccomp.to_owned(),
            landlock_abi: if gvisor { 0 } else { facts.landlock_abi },
            // Landlock is the executor's to enforce inside the unit; until it
            // reports, nothing claims it.
            landlock_enforced: false,
            namespaces,
            user_namespace,
            tmp: tmp_options.map(|options| tmpfs_exec(options)),
        },
        env_passed,
        env_scrubbed,
        git_neutralised: spec.security.neutralise_git,
        secrets: Vec::new(),
        persisted_credentials: Vec::new(),
        parent: None,
        lifecycle,
        state,
        // The backend says which of its volumes the engine mounted.
        volumes: Vec::new(),
        // The backend says what the init filled it with.
        home: home.map(|path| box_policy::envelope::AppliedHome {
            path,
            seeded_from: None,
        }),
        // Remapped, the unit's uid 0 is an unprivileged uid of the host.
        root_user: (uid_is_root && !user_namespace).then(box_policy::envelope::RootUser::new),
        warm: None,
    }
}

/// The lease of a listed unit: its label, else (a unit made before the
/// label) its init's `--lease-ms` in the command the engine lists.
pub(crate) fn listed_lease_ms(label: Option<&str>, command: Option<&str>) -> Option<u64> {
    if let Some(lease_ms) = label.and_then(|label| label.parse().ok()) {
        return Some(lease_ms);
    }
    let words: Vec<String> = command?.split_whitespace().map(str::to_owned).collect();
    applied_lease(&words).map(|lifecycle| lifecycle.lease_ms)
}

/// The lease the unit's init was started with, read from the entrypoint the
/// engine reports (`/.box/box init ... --lease-ms N ...`): absent when the
/// unit's first process is not box's init.
pub(super) fn applied_lease(entrypoint: &[String]) -> Option<box_backend::AppliedLifecycle> {
    let config = init_config(entrypoint)?;
    Some(box_backend::AppliedLifecycle {
        lease_ms: u64::try_from(config.lease.as_millis()).unwrap_or(u64::MAX),
    })
}

/// The configuration of box's init from a unit's entrypoint, if it is one.
pub(super) fn init_config(entrypoint: &[String]) -> Option<box_init::InitConfig> {
    let [program, subcommand, args @ ..] = entrypoint else {
        return None;
    };
    if program != EXECUTOR_PATH || subcommand != "init" {
        return None;
    }
    box_init::InitConfig::parse_args(args.iter()).ok()
}

/// `uid:gid` from Docker's user forms (`1000`, `1000:1000`, `box`); a name
/// stays as given, since resolving it needs the image's /etc/passwd.
pub(super) fn normalise_user(user: &str) -> String {
    if user.is_empty() {
        // No user anywhere: the engine runs the process as root.
        return "0:0".to_owned();
    }
    if user.contains(':') {
        return user.to_owned();
    }
    if user.chars().all(|c| c.is_ascii_digit()) {
        // Docker gives a bare uid the primary gid from the image's passwd, or 0.
        return format!("{user}:?");
    }
    user.to_owned()
}

/// What the real executor adds on top of what the engine applied, claimed
/// only where the executor refuses to serve without it: box's seccomp layer
/// (`--seccomp on`, installed on itself and so on every child) joins the
/// engine's, and landlock is enforced where the plan requires it (under
/// best-effort nothing here observes the outcome, so nothing is claimed).
pub fn add_executor_confinement(envelope: &mut Envelope, spec: &UnitSpec) {
    envelope.hardening.seccomp = match envelope.hardening.seccomp.as_str() {
        "none" => "box".to_owned(),
        engine => format!("{engine}+box"),
    };
    envelope.hardening.landlock_enforced =
        spec.security.landlock == Requirement::Required && envelope.hardening.landlock_abi > 0;
}

/// A numeric tmpfs option (`size=`, `nr_inodes=`) as the engine holds it.
pub(super) fn tmpfs_option(options: &str, name: &str) -> Option<u64> {
    options
        .split(',')
        .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
        .and_then(|s| s.parse().ok())
}
