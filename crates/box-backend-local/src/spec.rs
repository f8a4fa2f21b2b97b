//! The unit's layout on the host and the helper's spec for it, from the
//! unit spec: what the local backend can apply (`check_spec`), the
//! `SandboxSpec`, the executor's flags. Pure but for the layout's I/O.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::helper::{
    SandboxSpec, SecretValues, SpecEgress, SpecHome, SpecNetwork, SpecRequirement, SpecTmp,
    SpecUser, SpecVolume,
};

use box_backend::environment::{self, UnitEnvironment};
use box_backend::{BackendError, EgressWiring, SessionLabel, Unenforceable, UnitWiring};
use box_confine::Rlimits;
use box_policy::executor::{PlaceKind, SECRET_VALUE_PREFIX, SECRETS_DIR};
use box_policy::plan::{
    LocalUserland, MountMode, NetworkMode, Requirement, Role, TmpMode, UnitSpec, VolumePath,
    VolumeScope, WorkspaceSource,
};

use crate::LocalOptions;
use crate::volumes::LocalVolume;

/// What a new user's home holds (useradd's skeleton): a local unit's home
/// starts with a copy of it.
const SKEL: &str = "/etc/skel";

/// The unit's private directories on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The private temp directory, removed with the unit; also `TMPDIR`, so
    /// the executor's own confinement (writes beneath its root and `TMPDIR`)
    /// keeps `HOME` writable.
    pub temp: PathBuf,
    /// The executor's root when the unit has no workspace (empty).
    pub tmp: PathBuf,
    /// `HOME` inside it.
    pub home: PathBuf,
    /// The workspace, if the unit has one.
    pub workspace: Option<PathBuf>,
    /// Its volumes, made ready in box's volume store (by the start; none
    /// in a planned layout).
    pub volumes: Vec<LocalVolume>,
}

impl Layout {
    /// The layout beneath `temp` for `source` (no I/O). Pure.
    pub(crate) fn plan(temp: PathBuf, source: &WorkspaceSource) -> Self {
        let workspace = match source {
            WorkspaceSource::Host(path) => Some(path.clone()),
            WorkspaceSource::Empty => Some(temp.join("workspace")),
            WorkspaceSource::None => None,
        };
        Self {
            tmp: temp.join("tmp"),
            home: temp.join("home"),
            temp,
            workspace,
            volumes: Vec::new(),
        }
    }

    /// Name the unit's directories (and resolve its host workspace); nothing
    /// is created yet.
    pub(crate) fn name(
        temp_root: &Path,
        session: &SessionLabel,
        spec: &UnitSpec,
    ) -> Result<Self, BackendError> {
        let failed = |doing: String, error: std::io::Error| BackendError::Other {
            unit: spec.name.clone(),
            doing,
            message: error.to_string(),
        };
        let tag: String = format!("{}-{}", session.session, spec.name)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(48)
            .collect();
        let temp = temp_root.join(format!("box-local-{tag}-{:016x}", rand::random::<u64>()));
        let mut layout = Self::plan(temp, &spec.source);
        if let WorkspaceSource::Host(path) = &spec.source {
            let canonical = std::fs::canonicalize(path)
                .map_err(|error| failed(format!("opening workspace {}", path.display()), error))?;
            layout.workspace = Some(canonical);
        }
        Ok(layout)
    }

    /// Create the unit's directories (the caller removes them on failure).
    pub(crate) fn make(&self, spec: &UnitSpec) -> Result<(), BackendError> {
        let failed = |doing: String, error: std::io::Error| BackendError::Other {
            unit: spec.name.clone(),
            doing,
            message: error.to_string(),
        };
        let layout = self;
        use std::os::unix::fs::DirBuilderExt;
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        builder
            .create(&layout.temp)
            .map_err(|error| failed(format!("creating {}", layout.temp.display()), error))?;
        let mut made = vec![layout.temp.clone(), layout.tmp.clone(), layout.home.clone()];
        if spec.source == WorkspaceSource::Empty
            && let Some(workspace) = &layout.workspace
        {
            made.push(workspace.clone());
        }
        for dir in &made[1..] {
            builder
                .create(dir)
                .map_err(|error| failed(format!("creating {}", dir.display()), error))?;
        }
        // A root host running the unit as another user hands it its own directories.
        if let Some(user) = spec.user
            && nix::unistd::geteuid().is_root()
            && user.uid != 0
        {
            for dir in &made {
                let owner = Some(nix::unistd::Uid::from_raw(user.uid));
                let group = Some(nix::unistd::Gid::from_raw(user.gid));
                nix::unistd::chown(dir, owner, group).map_err(|errno| {
                    failed(
                        format!("handing {} to the unit's user", dir.display()),
                        errno.into(),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// The unit's environment (`backend::environment`, as on every backend):
/// box's own `HOME` and `TMPDIR` are inside the unit's private temp (the
/// host's home is not readable there), its `PATH` the standard one.
/// Pure given `host_vars`.
pub(crate) fn unit_environment<I>(host_vars: I, spec: &UnitSpec, layout: &Layout) -> UnitEnvironment
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let own = environment::Own {
        home: layout.home.display().to_string(),
        path: environment::STANDARD_PATH.to_owned(),
        tmpdir: layout.temp.display().to_string(),
    };
    environment::unit_environment(spec, host_vars, &own)
}

/// What the local backend cannot apply to `spec`, every one named: an
/// image (a unit runs on the host's own userland, which only the unit's
/// `local_userland = "host"` accepts in place of its image), an engine's
/// runtime, a privileged unit, a host namespace it does not know, an egress unit or
/// secrets with the host's network or mount namespace shared, capabilities
/// granted back, and landlock required where the kernel has none (judged
/// only when `landlock_abi` is given; the helper judges it again where it
/// confines). Pure; [`Backend::check`] and `sandbox_spec` both ask.
pub fn check_spec(spec: &UnitSpec, landlock_abi: Option<u32>) -> Result<(), Vec<Unenforceable>> {
    let mut refusals = Vec::new();
    let mut refuse = |control: String, why: &str| {
        refusals.push(Unenforceable {
            unit: spec.name.clone(),
            control,
            why: why.to_owned(),
        })
    };
    // Where the profile writes the unit's fields.
    let (field, table) = match spec.role {
        Role::Workspace => ("workspace".to_owned(), "[workspace]".to_owned()),
        Role::Server => (
            format!("server[{}]", spec.name),
            format!("its [[server]] table (name = {:?})", spec.name),
        ),
    };
    if spec.local_userland == LocalUserland::Refuse {
        refuse(
            format!("{field}.image {}", spec.image),
            &format!(
                "the local backend runs a unit on this host's own userland and cannot give it an image; use the docker backend (--backend docker), or, to run it on the host's userland instead, write local_userland = \"host\" under {table} in the profile"
            ),
        );
    }
    if let Some(runtime) = &spec.runtime {
        refuse(
            format!("{field}.runtime {runtime}"),
            "the local backend has no OCI runtime (a unit is a sandboxed process tree on this host's kernel); use the docker backend (--backend docker), or remove runtime from the profile",
        );
    }
    if spec.security.privileged {
        refuse(
            "privileged".to_owned(),
            "the local backend cannot run a privileged unit; use the docker backend",
        );
    }
    for namespace in &spec.security.host_namespaces {
        if !matches!(
            namespace.as_str(),
            "user" | "mount" | "ipc" | "pid" | "net" | "network" | "uts" | "cgroup"
        ) {
            refuse(
                format!("host namespace {namespace}"),
                "not one of user, mount, ipc, net, pid, uts, cgroup",
            );
        }
    }
    let shares = |name: &str| {
        spec.security
            .host_namespaces
            .iter()
            .any(|namespace| namespace == name)
    };
    if spec.network.mode == NetworkMode::Egress && (shares("net") || shares("network")) {
        refuse(
            "network egress allow list".to_owned(),
            "an egress unit's boundary is a network namespace of its own (only lo); it cannot share the host's",
        );
    }
    // Only a mount namespace of the unit's own can mount a volume away from
    // its home (beneath the home, a link stands in for the mount).
    if shares("mount") {
        for volume in &spec.volumes {
            if let VolumePath::Absolute(path) = &volume.path {
                refuse(
                    format!("volume {:?}", volume.name),
                    &format!(
                        "the unit shares the host's mount namespace, so nothing can be mounted at {}; give it a ~/ path, or do not share the mount namespace",
                        path.display()
                    ),
                );
            }
        }
    }
    if !spec.env_secrets.is_empty() && shares("mount") {
        refuse(
            format!("env.secrets {}", spec.env_secrets.join(", ")),
            "secrets are delivered on a tmpfs in the unit's own mount namespace; it cannot share the host's",
        );
    }
    if !spec.security.capabilities.is_empty() {
        refuse(
            format!("capabilities {}", spec.security.capabilities.join(", ")),
            "the local backend drops every capability and grants none back; use the docker backend",
        );
    }
    if spec.security.landlock == Requirement::Required && landlock_abi == Some(0) {
        refuse(
            "landlock".to_owned(),
            "the host kernel offers no landlock ABI",
        );
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals)
    }
}

/// The helper's spec for a unit. Pure. Fails naming the first thing the
/// local backend cannot apply ([`check_spec`]).
pub(crate) fn sandbox_spec(
    spec: &UnitSpec,
    layout: &Layout,
    environment: &UnitEnvironment,
    options: &LocalOptions,
    wiring: &UnitWiring,
) -> Result<SandboxSpec, BackendError> {
    if let Err(refusals) = check_spec(spec, None)
        && let Some(first) = refusals.into_iter().next()
    {
        return Err(first.into());
    }
    // Host namespaces the operator allowed: the unit simply does not get its
    // own. The local backend never makes uts or cgroup namespaces.
    let mut share = Vec::new();
    for namespace in &spec.security.host_namespaces {
        match namespace.as_str() {
            "user" | "mount" | "ipc" | "pid" => share.push(namespace.clone()),
            "net" | "network" => share.push("net".to_owned()),
            _ => {}
        }
    }
    let network = match spec.network.mode {
        NetworkMode::None if share.iter().any(|name| name == "net") => SpecNetwork::Host,
        // Egress is network none plus the proxy's socket (a shared network
        // namespace was refused above).
        NetworkMode::None | NetworkMode::Egress => SpecNetwork::None,
        NetworkMode::Bridge => SpecNetwork::Host,
    };
    let mut write = Vec::new();
    let mut read = vec![options.box_exe.clone()];
    if let Some(workspace) = &layout.workspace {
        match spec.mode {
            MountMode::ReadWrite => write.push(workspace.clone()),
            MountMode::ReadOnly => read.push(workspace.clone()),
        }
    }
    write.push(layout.temp.clone());
    // Host devices the operator allowed, beside the minimal set.
    write.extend(spec.security.devices.iter().cloned());
    // A volume elsewhere than beneath the home (which is writable already).
    let volumes: Vec<SpecVolume> = layout
        .volumes
        .iter()
        .map(|local| SpecVolume {
            name: local.volume.name.clone(),
            scope: local.volume.scope.as_str().to_owned(),
            shared_with: (local.volume.scope == VolumeScope::Profile)
                .then(|| local.profile.clone()),
            data: local.prepared.data.clone(),
            lock: local.prepared.lock.clone(),
            target: local.target(&layout.home),
        })
        .collect();
    write.extend(
        volumes
            .iter()
            .filter(|volume| !volume.target.starts_with(&layout.home))
            .map(|volume| volume.target.clone()),
    );
    // A worktree fork's borrowed objects: readable, never writable (the
    // helper binds them back read-only too).
    let objects = wiring.objects.as_ref().map(|objects| objects.host.clone());
    read.extend(objects.iter().cloned());
    Ok(SandboxSpec {
        unit: spec.name.clone(),
        write,
        read,
        cwd: layout
            .workspace
            .clone()
            .unwrap_or_else(|| layout.tmp.clone()),
        network,
        user: spec.user.map(|user| SpecUser {
            uid: user.uid,
            gid: user.gid,
        }),
        rlimits: Rlimits::from_limits(&spec.limits),
        landlock: spec.security.landlock.into(),
        landlock_min_abi: options.landlock_min_abi,
        namespaces: options.namespaces.into(),
        env: environment.vars.clone(),
        seccomp: SpecRequirement::BestEffort,
        conceal: Vec::new(),
        share,
        egress: wiring
            .egress
            .as_ref()
            .filter(|_| spec.network.mode == NetworkMode::Egress)
            .map(|wiring| SpecEgress {
                socket_dir: wiring.socket_dir.clone(),
                port: EgressWiring::BRIDGE_PORT,
            }),
        secrets_dir: (!environment.secrets.is_empty()).then(|| PathBuf::from(SECRETS_DIR)),
        secret_values: SecretValues(
            environment
                .secrets
                .iter()
                .map(|(name, value)| (format!("{SECRET_VALUE_PREFIX}{name}"), value.clone()))
                .collect(),
        ),
        // Set by the start, which listens for the helper.
        init: None,
        objects,
        tmp: Some(SpecTmp {
            bytes: spec.limits.tmp_bytes,
            exec: spec.security.tmp == TmpMode::Exec,
        }),
        // What a new user's home holds on the host whose userland the unit
        // runs on; never the caller's own home.
        home: Some(SpecHome {
            path: layout.home.clone(),
            bytes: spec.limits.home_bytes,
            skel: Some(PathBuf::from(SKEL)),
        }),
        volumes,
    })
}

/// The executor's command line for a unit. Pure. Without a workspace the
/// executor's root is an empty directory in the unit's private temp, so its
/// file tools reach nothing of the host. The executor confines itself too (a
/// second landlock layer, writes only beneath its root and TMPDIR).
pub(crate) fn executor_command(
    box_exe: &Path,
    spec: &UnitSpec,
    layout: &Layout,
    wiring: &UnitWiring,
) -> Vec<OsString> {
    let executor = executor_spec(spec, layout, wiring);
    std::iter::once(box_exe.into())
        .chain(executor.to_args().into_iter().map(OsString::from))
        .collect()
}

/// The executor's flags for a unit ([`executor_command`]'s, and a pooled
/// unit's bind line's). Pure.
pub(crate) fn executor_spec(
    spec: &UnitSpec,
    layout: &Layout,
    wiring: &UnitWiring,
) -> box_policy::executor::ExecutorSpec {
    let root = layout.workspace.as_ref().unwrap_or(&layout.tmp);
    let mut executor = spec.executor_spec(root, PlaceKind::Local);
    // The socket's directory, and a worktree fork's borrowed objects, are
    // seen inside the unit at their host paths.
    executor.egress_socket = wiring
        .egress
        .as_ref()
        .map(|egress| egress.socket_dir.join(EgressWiring::SOCKET));
    executor.read = wiring
        .objects
        .iter()
        .map(|objects| objects.host.clone())
        .collect();
    // The unit's home and its own /tmp (where TMPDIR points when the helper
    // could mount one; without it the helper's landlock layer keeps the
    // host's /tmp unwritable whatever this layer allows).
    executor.write = vec![layout.home.clone(), PathBuf::from("/tmp")];
    // Volumes: where the unit sees one outside its home, and its directory
    // on the host, which a unit without a mount namespace reaches through a
    // link (elsewhere that path is hidden, and a rule for a missing path is
    // skipped; the helper's layer grants it only to a link).
    for local in &layout.volumes {
        let target = local.target(&layout.home);
        if !target.starts_with(&layout.home) {
            executor.write.push(target);
        }
        executor.write.push(local.prepared.data.clone());
    }
    executor
}
