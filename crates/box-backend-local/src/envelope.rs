//! The envelope: what the helper reported it applied. Pure.

use crate::helper::{Applied, SandboxSpec, SpecNetwork};

use box_backend::environment::UnitEnvironment;
use box_backend::{DeliveredSecret, EgressWiring, Envelope, Hardening};
use box_policy::envelope::{
    AppliedLimits, AppliedNetwork, BackendKind, EgressLimits, LocalNone, ProcessLimits, UnitState,
};
use box_policy::executor::SECRETS_DIR;
use box_policy::plan::{TmpMode, UnitSpec};

use crate::spec::Layout;

/// The envelope: what the helper reported it applied. Pure.
pub(crate) fn envelope(
    spec: &UnitSpec,
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
    environment: &UnitEnvironment,
    id: &str,
    layout: &Layout,
) -> Envelope {
    let names = (environment.passed(), environment.scrubbed.clone());
    envelope_from_parts(spec, sandbox_spec, applied, names, id, layout)
}

/// [`envelope`] from the environment's names (passed, scrubbed), as a run
/// directory's record and the persisted state keep them. Pure.
pub(crate) fn envelope_from_parts(
    spec: &UnitSpec,
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
    (env_passed, env_scrubbed): (Vec<String>, Vec<String>),
    id: &str,
    layout: &Layout,
) -> Envelope {
    let has = |name: &str| applied.namespaces.iter().any(|entered| entered == name);
    // The helper refuses an egress unit it cannot give a network namespace.
    let egress = sandbox_spec.egress.is_some() && has("net");
    let network = match sandbox_spec.network {
        SpecNetwork::None => AppliedNetwork {
            mode: if egress { "egress" } else { "none" }.to_owned(),
            allow: if egress {
                spec.network.allow.clone()
            } else {
                Vec::new()
            },
            proxy: egress.then(|| EgressWiring::PROXY_URL.to_owned()),
            egress_limits: egress.then_some(EgressLimits {
                max_connections: spec.network.max_connections,
                bytes_per_second: spec.network.bytes_per_second,
            }),
            session_network: None,
            local_none: Some(LocalNone {
                namespace: has("net"),
                loopback_up: applied.loopback_up,
                landlock_tcp_denied: applied.landlock_tcp_denied,
                ip_sockets_denied: applied.ip_sockets_denied,
                landlock_tcp_ports: applied.landlock_tcp_ports.clone(),
            }),
        },
        SpecNetwork::Host => AppliedNetwork {
            mode: "host".to_owned(),
            allow: Vec::new(),
            proxy: None,
            egress_limits: None,
            session_network: None,
            local_none: None,
        },
    };
    let nproc_binds = applied.host_uid != 0;
    let mut not_applied = vec![
        "cpus: the local backend has no cgroup".to_owned(),
        "memory: per process (RLIMIT_DATA, RLIMIT_AS), not for the unit as a whole".to_owned(),
    ];
    let home_bytes = applied.home.as_ref().and_then(|home| home.bytes);
    if home_bytes.is_none() {
        not_applied.push(
            "home: no mount namespace of its own, so HOME is a private directory on the host's disk, bounded per file (RLIMIT_FSIZE), not a quota"
                .to_owned(),
        );
    }
    if applied.tmp.is_none() {
        not_applied.push(
            "tmp: the unit got no /tmp of its own (without a mount namespace of its own, or with the host's /tmp inside its workspace); TMPDIR is a private directory on the host's disk, bounded per file (RLIMIT_FSIZE), not a quota"
                .to_owned(),
        );
    }
    for made in applied.volumes.iter().filter(|made| made.linked) {
        if let Some(volume) = sandbox_spec.volumes.iter().find(|v| v.name == made.name) {
            not_applied.push(format!(
                "volume {}: no mount namespace of its own, so {} is a link to its directory on the host ({})",
                volume.name,
                volume.target.display(),
                volume.data.display()
            ));
        }
    }
    for directory in &applied.unhidden {
        not_applied.push(format!(
            "host directory not hidden ({directory}): Unix sockets beneath it stay reachable where file permissions allow"
        ));
    }
    if !has("mount") {
        not_applied.push(
            "host directories: no mount namespace, so Unix sockets outside the unit (Docker, SSH agent) stay reachable where file permissions allow"
                .to_owned(),
        );
    }
    if applied.host_uid == 0 && applied.concealed == 0 && !sandbox_spec.conceal.is_empty() {
        not_applied.push(
            "root-only host files: the unit is the host's uid 0 and no mount namespace hides /etc/shadow and the like"
                .to_owned(),
        );
    }
    if !nproc_binds {
        not_applied.push("pids: RLIMIT_NPROC does not bind the host's uid 0".to_owned());
    }
    let limits = AppliedLimits::Process(ProcessLimits {
        memory_bytes: applied.rlimits.data_bytes,
        address_space_bytes: applied.rlimits.address_space_bytes,
        pids: applied.rlimits.nproc,
        nofile: applied.rlimits.nofile,
        file_size_bytes: applied.rlimits.fsize_bytes,
        core_bytes: applied.rlimits.core_bytes,
        tmp_bytes: applied.tmp.map(|tmp| tmp.bytes),
        home_bytes,
        not_applied,
        start_timeout_ms: None,
    });
    Envelope {
        name: spec.name.clone(),
        role: spec.role,
        backend: BackendKind::Local,
        id: id.to_owned(),
        image: String::new(),
        image_id: String::new(),
        image_digest: None,
        runtime: None,
        // The local backend starts only units that may run here (check_spec).
        userland: Some("host".to_owned()),
        root: layout
            .workspace
            .as_ref()
            .map(|path| path.display().to_string())
            .unwrap_or_default(),
        user: format!("{}:{}", applied.uid, applied.gid),
        network,
        limits,
        hardening: Hardening {
            capabilities: box_confine::capability_names(applied.capabilities.effective),
            no_new_privileges: applied.no_new_privs,
            // Landlock grants writes only to the workspace and the unit's temp.
            read_only_root: applied.landlock.enforced,
            seccomp: if applied.seccomp { "box" } else { "none" }.to_owned(),
            landlock_abi: applied.landlock.abi,
            landlock_enforced: applied.landlock.enforced,
            namespaces: applied.namespaces.clone(),
            user_namespace: has("user"),
            tmp: applied.tmp.map(|tmp| {
                if tmp.exec {
                    TmpMode::Exec
                } else {
                    TmpMode::NoExec
                }
            }),
        },
        env_passed,
        env_scrubbed,
        git_neutralised: spec.security.neutralise_git
            && !box_scrub::git_neutralisation().is_empty(),
        secrets: Vec::new(),
        persisted_credentials: Vec::new(),
        parent: None,
        lifecycle: applied
            .lease_ms
            .map(|lease_ms| box_backend::AppliedLifecycle { lease_ms }),
        state: UnitState::Running,
        volumes: applied_volumes(sandbox_spec, applied),
        home: applied
            .home
            .as_ref()
            .map(|home| box_policy::envelope::AppliedHome {
                path: layout.home.display().to_string(),
                seeded_from: home
                    .seeded_from
                    .as_ref()
                    .map(|skel| skel.display().to_string()),
            }),
        // The unit's user namespace maps its ids to themselves: uid 0 in it
        // is the host's root.
        root_user: (applied.host_uid == 0).then(box_policy::envelope::RootUser::new),
        warm: None,
    }
}

/// The envelope's volumes: each one the helper reported it made.
pub(crate) fn applied_volumes(
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
) -> Vec<box_policy::envelope::AppliedVolume> {
    sandbox_spec
        .volumes
        .iter()
        .filter(|volume| applied.volumes.iter().any(|made| made.name == volume.name))
        .map(|volume| box_policy::envelope::AppliedVolume {
            name: volume.name.clone(),
            path: volume.target.display().to_string(),
            scope: volume.scope.clone(),
            shared_with: volume.shared_with.clone(),
            id: volume.data.display().to_string(),
        })
        .collect()
}

/// The envelope's `secrets`: each one the executor was told to write.
pub(crate) fn delivered_secrets(spec: &UnitSpec) -> Vec<DeliveredSecret> {
    spec.env_secrets
        .iter()
        .map(|name| DeliveredSecret {
            name: name.clone(),
            path: format!("{SECRETS_DIR}/{name}"),
            as_env: spec.env_secrets_as_env.contains(name),
        })
        .collect()
}
