use std::collections::BTreeMap;
use std::time::Duration;

use pretty_assertions::assert_eq;

use std::os::unix::process::ExitStatusExt;

use super::*;
use crate::ended::unit_end;
use crate::envelope::envelope_from_parts;
use crate::helper::{Applied, SpecEgress, SpecNetwork, SpecRequirement, SpecUser};
use crate::spec::{executor_command, sandbox_spec};
use crate::start::printable;
use crate::volumes::LocalVolume;
use box_backend::environment::{self, UnitEnvironment};
use box_backend::{EgressWiring, ObjectsWiring};
use box_confine::{CapabilitySets, LandlockOutcome, Rlimits};
use box_policy::envelope::{AppliedLimits, BackendKind};
use box_policy::plan::{Limits, MountMode, Network, Role, Security, UserIds, WorkspaceSource};

fn unit_spec(source: WorkspaceSource) -> UnitSpec {
    UnitSpec {
        name: "workspace".to_owned(),
        role: Role::Workspace,
        image: "box-base:bookworm".to_owned(),
        pull: box_policy::plan::PullPolicy::Missing,
        pull_secret: None,
        runtime: None,
        local_userland: box_policy::plan::LocalUserland::Host,
        source,
        root: PathBuf::from("/workspace"),
        mode: MountMode::ReadWrite,
        user: Some(UserIds {
            uid: 1000,
            gid: 1000,
        }),
        network: Network::none(),
        limits: Limits {
            memory_bytes: 1 << 30,
            cpus: 1.0,
            pids: 128,
            tmp_bytes: 64 << 20,
            home_bytes: 64 << 20,
            nofile: 512,
            call_timeout: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            lifetime: Duration::from_secs(60),
            // The rest (the start deadline) as a shipped profile has them.
            ..Limits::default()
        },
        env_set: BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]),
        env_pass: Vec::new(),
        env_secrets: Vec::new(),
        env_secrets_as_env: Vec::new(),
        security: Security {
            capabilities: Vec::new(),
            read_only_root: true,
            landlock: Requirement::Required,
            neutralise_git: true,
            write_guard: true,
            tmp: box_policy::plan::TmpMode::Exec,
            privileged: false,
            host_namespaces: Vec::new(),
            devices: Vec::new(),
        },
        command: Vec::new(),
        lease: Duration::from_secs(30),
        description: String::new(),
        volumes: Vec::new(),
        written: None,
    }
}

fn options() -> LocalOptions {
    LocalOptions {
        box_exe: PathBuf::from("/opt/box/box"),
        namespaces: Requirement::BestEffort,
        landlock_min_abi: 1,
        temp_root: PathBuf::from("/tmp"),
    }
}

fn layout(source: &WorkspaceSource) -> Layout {
    Layout::plan(PathBuf::from("/tmp/box-local-s-u"), source)
}

fn applied() -> Applied {
    Applied {
        namespaces: vec!["user".to_owned(), "mount".to_owned(), "pid".to_owned()],
        namespace_failures: vec!["net: unshare: EPERM".to_owned()],
        host_uid: 1000,
        uid: 1000,
        gid: 1000,
        proc_mounted: true,
        sys_mounted: false,
        hidden: vec!["/home".to_owned(), "/run".to_owned()],
        unhidden: Vec::new(),
        concealed: 0,
        own_ptys: true,
        nested_user_namespaces_blocked: true,
        loopback_up: false,
        landlock_tcp_denied: true,
        landlock: LandlockOutcome {
            abi: 6,
            fully_enforced: true,
            enforced: true,
        },
        no_new_privs: true,
        capabilities: CapabilitySets::default(),
        seccomp: true,
        ip_sockets_denied: false,
        landlock_tcp_ports: Vec::new(),
        egress_bound: false,
        objects_bound: false,
        secrets_mounted: false,
        tmp: Some(super::helper::SpecTmp {
            bytes: 256 << 20,
            exec: true,
        }),
        home: Some(super::helper::AppliedHomeReport {
            bytes: Some(512 << 20),
            seeded_from: Some(PathBuf::from("/etc/skel")),
        }),
        volumes: Vec::new(),
        lease_ms: None,
        rlimits: Rlimits::from_limits(&unit_spec(WorkspaceSource::Empty).limits),
    }
}

#[test]
fn a_writable_workspace_and_the_temp_are_the_only_writes() {
    let source = WorkspaceSource::Host(PathBuf::from("/src/project"));
    let spec = unit_spec(source.clone());
    let layout = layout(&source);
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    assert_eq!(
        sandbox.write,
        vec![
            PathBuf::from("/src/project"),
            PathBuf::from("/tmp/box-local-s-u")
        ]
    );
    assert_eq!(sandbox.read, vec![PathBuf::from("/opt/box/box")]);
    assert_eq!(sandbox.cwd, PathBuf::from("/src/project"));
    assert_eq!(sandbox.network, SpecNetwork::None);
    assert_eq!(sandbox.landlock, SpecRequirement::Required);
    assert_eq!(
        sandbox.user,
        Some(SpecUser {
            uid: 1000,
            gid: 1000
        })
    );
}

#[test]
fn a_read_only_workspace_is_only_read() {
    let source = WorkspaceSource::Host(PathBuf::from("/src/project"));
    let mut spec = unit_spec(source.clone());
    spec.mode = MountMode::ReadOnly;
    let sandbox = sandbox_spec(
        &spec,
        &layout(&source),
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    assert_eq!(sandbox.write, vec![PathBuf::from("/tmp/box-local-s-u")]);
    assert!(sandbox.read.contains(&PathBuf::from("/src/project")));
}

/// The host's egress socket directory, as the host wires it.
fn egress_wiring() -> EgressWiring {
    EgressWiring {
        socket_dir: PathBuf::from("/run/box/egress/0123"),
    }
}

#[test]
fn an_egress_unit_is_network_none_plus_the_proxys_socket() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.network.mode = NetworkMode::Egress;
    spec.network.allow = vec!["example.com".to_owned()];
    spec.network.max_connections = 64;
    let layout = layout(&WorkspaceSource::Empty);
    let wiring = UnitWiring {
        egress: Some(egress_wiring()),
        ..UnitWiring::default()
    };
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &wiring,
    )
    .unwrap();
    assert_eq!(sandbox.network, SpecNetwork::None);
    assert_eq!(
        sandbox.egress,
        Some(SpecEgress {
            socket_dir: PathBuf::from("/run/box/egress/0123"),
            port: 3128,
        })
    );
    // Not writable, not readable: the unit only connects to the socket.
    assert!(
        !sandbox
            .write
            .iter()
            .any(|path| path.starts_with("/run/box"))
    );
    assert!(!sandbox.read.iter().any(|path| path.starts_with("/run/box")));
    let command = executor_command(Path::new("/opt/box/box"), &spec, &layout, &wiring);
    let command: Vec<_> = command.iter().map(|arg| arg.to_string_lossy()).collect();
    let at = command
        .iter()
        .position(|arg| arg == "--egress-socket")
        .unwrap();
    assert_eq!(command[at + 1], "/run/box/egress/0123/proxy.sock");

    let mut applied = applied();
    applied.namespaces.push("net".to_owned());
    applied.loopback_up = true;
    applied.landlock_tcp_denied = false;
    applied.landlock_tcp_ports = vec![3128];
    let applied_envelope = envelope(
        &spec,
        &sandbox,
        &applied,
        &UnitEnvironment::default(),
        "42",
        &layout,
    );
    let network = serde_json::to_value(&applied_envelope.network).unwrap();
    assert_eq!(network["mode"], "egress", "{network}");
    assert_eq!(network["allow"], serde_json::json!(["example.com"]));
    assert_eq!(network["proxy"], "http://127.0.0.1:3128");
    assert_eq!(network["egressLimits"]["maxConnections"], 64);
    assert_eq!(network["namespace"], true);
    assert_eq!(network["ipSocketsDenied"], false);
    assert_eq!(network["landlockTcpPorts"], serde_json::json!([3128]));

    // Without a network namespace the helper refuses; were one missing from
    // a report, the envelope would not claim egress.
    applied.namespaces.retain(|name| name != "net");
    let applied_envelope = envelope(
        &spec,
        &sandbox,
        &applied,
        &UnitEnvironment::default(),
        "42",
        &layout,
    );
    assert_eq!(applied_envelope.network.mode, "none");
    assert_eq!(applied_envelope.network.proxy, None);
}

/// A worktree fork's borrowed objects: readable (never writable) under the
/// helper's landlock and the executor's, bound read-only by the helper, seen
/// at their host path (what the child's alternates name); only where the
/// unit gets a mount namespace of its own.
#[test]
fn borrowed_objects_are_read_only_at_their_host_path() {
    let source = WorkspaceSource::Host(PathBuf::from("/state/forks/i/s/fork-1"));
    let spec = unit_spec(source.clone());
    let layout = layout(&source);
    let objects = PathBuf::from("/src/project/.git/objects");
    let wiring = UnitWiring {
        objects: Some(ObjectsWiring {
            host: objects.clone(),
        }),
        ..UnitWiring::default()
    };
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &wiring,
    )
    .unwrap();
    assert_eq!(sandbox.objects, Some(objects.clone()));
    assert!(sandbox.read.contains(&objects), "{:?}", sandbox.read);
    assert!(
        !sandbox.write.iter().any(|path| objects.starts_with(path)),
        "{:?}",
        sandbox.write
    );
    let command = executor_command(Path::new("/opt/box/box"), &spec, &layout, &wiring);
    let command: Vec<_> = command.iter().map(|arg| arg.to_string_lossy()).collect();
    let at = command.iter().position(|arg| arg == "--read").unwrap();
    assert_eq!(command[at + 1], "/src/project/.git/objects");
    // Nothing borrowed, nothing named.
    let plain = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    assert_eq!(plain.objects, None);

    let backend = LocalBackend::with_options(options());
    assert_eq!(backend.objects_place(&spec), Ok(ObjectsPlace::HostPath));
    let mut shared = spec.clone();
    shared.security.host_namespaces = vec!["mount".to_owned()];
    let why = backend.objects_place(&shared).unwrap_err();
    assert!(why.contains("shares the host's mount namespace"), "{why}");
    let flat = LocalBackend::with_options(LocalOptions {
        namespaces: Requirement::Off,
        ..options()
    });
    let why = flat.objects_place(&spec).unwrap_err();
    assert!(why.contains("no namespaces"), "{why}");
}

#[test]
fn an_egress_unit_sharing_the_hosts_network_is_refused() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.network.mode = NetworkMode::Egress;
    spec.security.host_namespaces = vec!["net".to_owned()];
    let refusals = check_spec(&spec, Some(6)).unwrap_err();
    assert_eq!(refusals[0].control, "network egress allow list");
    assert!(
        refusals[0].why.contains("network namespace"),
        "{refusals:?}"
    );
}

#[test]
fn no_workspace_means_no_file_tools() {
    let spec = unit_spec(WorkspaceSource::None);
    let layout = layout(&WorkspaceSource::None);
    assert_eq!(layout.workspace, None);
    let command = executor_command(
        Path::new("/opt/box/box"),
        &spec,
        &layout,
        &UnitWiring::default(),
    );
    let command: Vec<_> = command.iter().map(|arg| arg.to_string_lossy()).collect();
    let expected = vec![
        "/opt/box/box",
        "execute",
        "--root",
        "/tmp/box-local-s-u/tmp",
        "--kind",
        "local",
        "--landlock",
        "required",
        "--pass-env",
        // What the profile sets is kept in children's environment.
        "GREETING",
        // The unit's home and its own /tmp are writable.
        "--write",
        "/tmp/box-local-s-u/home",
        "--write",
        "/tmp",
    ];
    assert_eq!(command, expected);
}

#[test]
fn an_empty_workspace_lives_in_the_unit_temp() {
    let layout = layout(&WorkspaceSource::Empty);
    assert_eq!(
        layout.workspace,
        Some(PathBuf::from("/tmp/box-local-s-u/workspace"))
    );
}

#[test]
fn the_environment_is_the_plans_with_home_and_tmpdir_in_the_units_temp() {
    let spec = unit_spec(WorkspaceSource::Empty);
    let layout = layout(&WorkspaceSource::Empty);
    let host = vec![
        (OsString::from("PATH"), OsString::from("/usr/bin")),
        (OsString::from("HOME"), OsString::from("/home/host")),
        (OsString::from("GREETING"), OsString::from("host")),
    ];
    let environment = unit_environment(host, &spec, &layout);
    let get = |name: &str| {
        environment
            .vars
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    // The host's own PATH and HOME are not the plan's: box's own stand.
    assert_eq!(get("PATH"), Some(environment::STANDARD_PATH));
    assert_eq!(get("HOME"), Some("/tmp/box-local-s-u/home"));
    assert_eq!(get("TMPDIR"), Some("/tmp/box-local-s-u"));
    assert_eq!(get("GREETING"), Some("hi"));
    assert_eq!(
        environment
            .vars
            .iter()
            .filter(|(key, _)| key == "GREETING")
            .count(),
        1
    );
}

#[test]
fn the_envelope_is_what_was_applied() {
    let spec = unit_spec(WorkspaceSource::Empty);
    let layout = layout(&WorkspaceSource::Empty);
    let environment = UnitEnvironment {
        vars: vec![("PATH".to_owned(), "/usr/bin".to_owned())],
        scrubbed: vec!["GITHUB_TOKEN".to_owned()],
        missing: Vec::new(),
        secrets: Vec::new(),
    };
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &environment,
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    let envelope = envelope(&spec, &sandbox, &applied(), &environment, "42", &layout);
    assert_eq!(envelope.backend, BackendKind::Local);
    assert_eq!(envelope.id, "42");
    assert_eq!(envelope.root, "/tmp/box-local-s-u/workspace");
    assert_eq!(envelope.user, "1000:1000");
    assert_eq!(envelope.hardening.namespaces, vec!["user", "mount", "pid"]);
    assert!(envelope.hardening.user_namespace);
    assert!(envelope.hardening.landlock_enforced);
    assert_eq!(envelope.hardening.landlock_abi, 6);
    assert!(envelope.hardening.capabilities.is_empty());
    assert_eq!(envelope.hardening.seccomp, "box");
    assert_eq!(
        serde_json::to_value(&envelope.network).unwrap()["namespace"],
        false
    );
    assert_eq!(
        serde_json::to_value(&envelope.network).unwrap()["landlockTcpDenied"],
        true
    );
    assert_eq!(serde_json::to_value(&envelope.limits).unwrap()["pids"], 128);
    assert_eq!(
        serde_json::to_value(&envelope.limits).unwrap()["nofile"],
        512
    );
    assert_eq!(envelope.env_passed, vec!["PATH"]);
    assert_eq!(envelope.env_scrubbed, vec!["GITHUB_TOKEN"]);
}

#[test]
fn pids_are_reported_unbound_for_host_root() {
    let spec = unit_spec(WorkspaceSource::Empty);
    let layout = layout(&WorkspaceSource::Empty);
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    let mut applied = applied();
    applied.host_uid = 0;
    let envelope = envelope(
        &spec,
        &sandbox,
        &applied,
        &UnitEnvironment::default(),
        "1",
        &layout,
    );
    let not_applied = serde_json::to_value(&envelope.limits).unwrap()["notApplied"].to_string();
    assert!(not_applied.contains("RLIMIT_NPROC"), "{not_applied}");
}

#[test]
fn a_signal_ends_with_code_minus_one_and_its_name() {
    let end = unit_end(Some(ExitStatus::from_raw(15)), false, None);
    assert_eq!(end.exit_code, Some(-1));
    assert_eq!(end.reason, "the executor was killed by SIGTERM (15)");
    let end = unit_end(Some(ExitStatus::from_raw(3 << 8)), true, None);
    assert_eq!(end.exit_code, Some(3));
    assert_eq!(
        end.reason,
        "the unit was removed (the executor exited with code 3)"
    );
}

/// Issue 22, item 6: a local unit has no memory cgroup of its own, so a
/// SIGKILL nobody here sent is "cannot tell" (`oomKilled: null`), never "not
/// the OOM killer"; every other end rules it out.
#[test]
fn a_local_sigkill_says_it_cannot_tell_the_oom_killer() {
    let end = unit_end(Some(ExitStatus::from_raw(9)), false, None);
    assert_eq!(end.exit_code, Some(-1));
    assert_eq!(end.oom_killed, None);
    assert_eq!(
        end.reason,
        "the executor was killed by SIGKILL (9): from outside or by the kernel's OOM killer, which box cannot tell for a local unit (it has no memory cgroup of its own)"
    );
    let removed = unit_end(Some(ExitStatus::from_raw(9)), true, None);
    assert_eq!(removed.oom_killed, Some(false));
    assert_eq!(
        removed.reason,
        "the unit was removed (the executor was killed by SIGKILL (9))"
    );
    assert_eq!(
        unit_end(Some(ExitStatus::from_raw(9)), false, Some(1000)).oom_killed,
        Some(false)
    );
    assert_eq!(
        unit_end(Some(ExitStatus::from_raw(3 << 8)), false, None).oom_killed,
        Some(false)
    );
    assert_eq!(
        unit_end(Some(ExitStatus::from_raw(15)), false, None).oom_killed,
        Some(false)
    );
    assert_eq!(unit_end(None, false, None).oom_killed, None);
}

#[test]
fn capabilities_granted_back_are_refused_naming_them() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.security.capabilities = vec!["CAP_NET_BIND_SERVICE".to_owned()];
    let error = sandbox_spec(
        &spec,
        &layout(&WorkspaceSource::Empty),
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("capabilities CAP_NET_BIND_SERVICE"),
        "{error}"
    );
}

#[test]
fn secrets_reach_the_executor_on_its_spec_never_its_command_line() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.env_secrets = vec!["DEPLOY_TOKEN".to_owned(), "API_KEY".to_owned()];
    spec.env_secrets_as_env = vec!["API_KEY".to_owned()];
    let layout = layout(&WorkspaceSource::Empty);
    let environment = UnitEnvironment {
        vars: vec![("PATH".to_owned(), "/usr/bin".to_owned())],
        scrubbed: Vec::new(),
        missing: Vec::new(),
        secrets: vec![
            ("DEPLOY_TOKEN".to_owned(), "deploy-value-1234".to_owned()),
            ("API_KEY".to_owned(), "api-value-5678".to_owned()),
        ],
    };
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &environment,
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    assert_eq!(sandbox.secrets_dir, Some(PathBuf::from("/run/secrets")));
    assert_eq!(
        sandbox.secret_values.0,
        vec![
            (
                "BOX_SECRET_DEPLOY_TOKEN".to_owned(),
                "deploy-value-1234".to_owned()
            ),
            ("BOX_SECRET_API_KEY".to_owned(), "api-value-5678".to_owned()),
        ]
    );
    // Not in CMD's environment (which a foreign command would get in its
    // execve), not in Debug output, not on the command line.
    assert!(!format!("{:?}", sandbox.env).contains("deploy-value"));
    assert!(!format!("{sandbox:?}").contains("deploy-value"));
    assert!(!format!("{sandbox:?}").contains("api-value"));
    let command = executor_command(
        Path::new("/opt/box/box"),
        &spec,
        &layout,
        &UnitWiring::default(),
    );
    let command: Vec<_> = command.iter().map(|arg| arg.to_string_lossy()).collect();
    assert!(
        !command.iter().any(|arg| arg.contains("-value-")),
        "{command:?}"
    );
    let at = command.iter().position(|arg| arg == "--secrets").unwrap();
    assert_eq!(command[at + 1], "DEPLOY_TOKEN,API_KEY:env");
    assert_eq!(
        delivered_secrets(&spec)
            .iter()
            .map(|secret| (secret.path.as_str(), secret.as_env))
            .collect::<Vec<_>>(),
        vec![
            ("/run/secrets/DEPLOY_TOKEN", false),
            ("/run/secrets/API_KEY", true)
        ]
    );
}

#[test]
fn secrets_sharing_the_hosts_mount_namespace_are_refused() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.env_secrets = vec!["DEPLOY_TOKEN".to_owned()];
    assert_eq!(check_spec(&spec, Some(3)), Ok(()));
    spec.security.host_namespaces = vec!["mount".to_owned()];
    let refusals = check_spec(&spec, Some(3)).unwrap_err();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].control, "env.secrets DEPLOY_TOKEN");
    assert!(refusals[0].why.contains("mount namespace"), "{refusals:?}");
}

#[test]
fn a_privileged_unit_is_refused_and_host_namespaces_are_shared() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    let layout = layout(&WorkspaceSource::Empty);
    spec.security.privileged = true;
    let error = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("privileged"), "{error}");
    spec.security.privileged = false;
    spec.security.host_namespaces = vec!["network".to_owned(), "uts".to_owned()];
    spec.security.devices = vec![PathBuf::from("/dev/kvm")];
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    assert_eq!(sandbox.share, vec!["net"]);
    assert_eq!(sandbox.network, SpecNetwork::Host);
    assert!(sandbox.write.contains(&PathBuf::from("/dev/kvm")));
    spec.security.host_namespaces = vec!["time".to_owned()];
    let error = sandbox_spec(
        &spec,
        &layout,
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("host namespace time"), "{error}");
}

#[test]
fn unit_stderr_is_logged_with_its_control_characters_escaped() {
    assert_eq!(printable("plain\ttext\n"), "plain\ttext\n");
    assert_eq!(
        printable("\u{1b}]52;c;AAAA\u{7}"),
        "\\u{1b}]52;c;AAAA\\u{7}"
    );
}

/// A run directory's record keeps what rebuilds the envelope, never the
/// environment's values, the secrets or the unit key; the envelope a later
/// host rebuilds from it is the one the start reported.
#[test]
fn the_record_keeps_no_secret_and_rebuilds_the_envelope() {
    let spec = unit_spec(WorkspaceSource::Empty);
    let layout = layout(&WorkspaceSource::Empty);
    let environment = UnitEnvironment {
        vars: vec![("TOKENISH".to_owned(), "value-of-a-var".to_owned())],
        scrubbed: vec!["GITHUB_TOKEN".to_owned()],
        missing: Vec::new(),
        secrets: vec![("API".to_owned(), "secret-value".to_owned())],
    };
    let mut sandbox = sandbox_spec(
        &spec,
        &layout,
        &environment,
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    sandbox.init = Some(helper::SpecInit {
        run_dir: "/run/box/units/x".into(),
        unit: "i/s/workspace".to_owned(),
        key: "ab".repeat(32),
        ttl_ms: 30_000,
    });
    assert!(!format!("{:?}", sandbox.init).contains(&"ab".repeat(32)));
    let record = lease::Record {
        id: "42".to_owned(),
        instance: "i".to_owned(),
        session: "s".to_owned(),
        unit: "workspace".to_owned(),
        profile: "default".to_owned(),
        created: "2026-01-01T00:00:00Z".to_owned(),
        parent: None,
        lease_ms: 30_000,
        helper: 42,
        helper_start: 7,
        temp: layout.temp.clone(),
        workspace: layout.workspace.clone(),
        executor: true,
        spec: sandbox.kept(),
        applied: applied(),
        pool: None,
        envelope: serde_json::to_value(envelope(
            &spec,
            &sandbox,
            &applied(),
            &environment,
            "42",
            &layout,
        ))
        .ok(),
    };
    let json = serde_json::to_string(&record).unwrap();
    // An older box's record, without the envelope, still reads.
    let mut older: serde_json::Value = serde_json::from_str(&json).unwrap();
    older.as_object_mut().unwrap().remove("envelope");
    let older: lease::Record = serde_json::from_value(older).unwrap();
    assert_eq!(older.envelope, None);
    for kept_out in ["value-of-a-var", "secret-value", &"ab".repeat(32)] {
        assert!(!json.contains(kept_out), "{kept_out} in {json}");
    }
    let dir = tempfile::tempdir().unwrap();
    record.write(dir.path()).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.path().join(lease::RECORD))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let read = lease::Record::read(dir.path()).unwrap();
    let names = (environment.passed(), environment.scrubbed.clone());
    assert_eq!(
        envelope_from_parts(&spec, &read.spec, &read.applied, names, "42", &layout),
        envelope(&spec, &sandbox, &applied(), &environment, "42", &layout)
    );
    assert_eq!(read.info("running").lease_ms, Some(30_000));
}

#[test]
fn a_helper_is_known_by_its_pid_and_start_time() {
    let me = std::process::id();
    let start = lease::start_time(me).unwrap();
    assert_eq!(lease::start_time(me), Some(start));
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert_eq!(lease::start_time(pid), None, "an ended, reaped process");
}

/// Issue 22, item 4: an image the local backend cannot give, and an engine's
/// runtime, are refused naming the field, the backend and the fix, unless
/// the unit's `local_userland = "host"` accepts the host's userland (which
/// never excuses a runtime).
#[test]
fn an_image_or_runtime_the_local_backend_cannot_give_is_refused() {
    let pin = "img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.image = pin.to_owned();
    assert_eq!(check_spec(&spec, Some(6)), Ok(()));
    spec.local_userland = box_policy::plan::LocalUserland::Refuse;
    let refusals = check_spec(&spec, Some(6)).unwrap_err();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(
        refusals[0].to_string(),
        format!(
            "unit workspace: workspace.image {pin}: the local backend runs a unit on this host's own userland and cannot give it an image; use the docker backend (--backend docker), or, to run it on the host's userland instead, write local_userland = \"host\" under [workspace] in the profile"
        )
    );
    let error = sandbox_spec(
        &spec,
        &layout(&WorkspaceSource::Empty),
        &UnitEnvironment::default(),
        &options(),
        &UnitWiring::default(),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with(&format!("unit workspace: workspace.image {pin} is required but cannot be applied here: the local backend")),
        "{error}"
    );
    let mut server = unit_spec(WorkspaceSource::None);
    server.name = "fetch".to_owned();
    server.role = Role::Server;
    server.local_userland = box_policy::plan::LocalUserland::Refuse;
    server.runtime = Some("runsc".to_owned());
    let refusals = check_spec(&server, Some(6)).unwrap_err();
    let controls: Vec<&str> = refusals
        .iter()
        .map(|refusal| refusal.control.as_str())
        .collect();
    assert_eq!(
        controls,
        [
            "server[fetch].image box-base:bookworm",
            "server[fetch].runtime runsc"
        ]
    );
    assert!(
        refusals[0]
            .why
            .contains("under its [[server]] table (name = \"fetch\")"),
        "{refusals:?}"
    );
    assert!(refusals[1].why.contains("no OCI runtime"), "{refusals:?}");
    server.local_userland = box_policy::plan::LocalUserland::Host;
    let refusals = check_spec(&server, Some(6)).unwrap_err();
    assert_eq!(
        refusals.len(),
        1,
        "a runtime is refused whatever the userland: {refusals:?}"
    );
}

#[test]
fn volumes_are_mounted_where_the_profile_says_and_reported() {
    let mut spec = unit_spec(WorkspaceSource::Empty);
    spec.volumes = vec![
        box_policy::plan::Volume {
            scope: box_policy::plan::VolumeScope::Profile,
            ..box_policy::plan::Volume::new(
                "pip-cache".to_owned(),
                box_policy::plan::VolumePath::Home(".cache/pip".into()),
            )
        },
        box_policy::plan::Volume {
            scope: box_policy::plan::VolumeScope::Session,
            ..box_policy::plan::Volume::new(
                "scratch".to_owned(),
                box_policy::plan::VolumePath::Absolute("/var/cache/scratch".into()),
            )
        },
    ];
    assert_eq!(check_spec(&spec, Some(3)), Ok(()));
    // Sharing the host's mount namespace, only the one beneath the home can be (linked).
    let mut shared = spec.clone();
    shared.security.host_namespaces = vec!["mount".to_owned()];
    let refusals = check_spec(&shared, Some(3)).unwrap_err();
    let controls: Vec<&str> = refusals.iter().map(|r| r.control.as_str()).collect();
    assert_eq!(controls, vec!["volume \"scratch\""]);
    let mut layout = layout(&spec.source);
    let store = PathBuf::from("/state/box/volumes/local");
    layout.volumes = spec
        .volumes
        .iter()
        .map(|volume| LocalVolume {
            volume: volume.clone(),
            prepared: box_backend::volumes::PreparedVolume {
                key: volume.name.clone(),
                data: store.join(&volume.name).join("data"),
                lock: store.join(&volume.name).join("lock"),
            },
            profile: "dev".to_owned(),
        })
        .collect();
    let environment = unit_environment(Vec::new(), &spec, &layout);
    let sandbox = sandbox_spec(
        &spec,
        &layout,
        &environment,
        &options(),
        &UnitWiring::default(),
    )
    .unwrap();
    let places: Vec<(&str, &Path, Option<&str>)> = sandbox
        .volumes
        .iter()
        .map(|volume| {
            (
                volume.name.as_str(),
                volume.target.as_path(),
                volume.shared_with.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        places,
        vec![
            (
                "pip-cache",
                Path::new("/tmp/box-local-s-u/home/.cache/pip"),
                Some("dev")
            ),
            ("scratch", Path::new("/var/cache/scratch"), None),
        ]
    );
    // The place outside the home is writable; the one beneath it already is.
    assert!(sandbox.write.contains(&PathBuf::from("/var/cache/scratch")));
    assert!(!sandbox.write.iter().any(|path| path.starts_with(&store)));
    let command = executor_command(
        Path::new("/opt/box/box"),
        &spec,
        &layout,
        &UnitWiring::default(),
    );
    let args: Vec<String> = command
        .iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    assert!(args.contains(&"/var/cache/scratch".to_owned()), "{args:?}");

    // Mounted: listed. Linked (no mount namespace): listed, and said.
    let mut applied = applied();
    applied.volumes = vec![
        super::helper::AppliedVolumeReport {
            name: "pip-cache".to_owned(),
            linked: true,
        },
        super::helper::AppliedVolumeReport {
            name: "scratch".to_owned(),
            linked: false,
        },
    ];
    let envelope = envelope(&spec, &sandbox, &applied, &environment, "42", &layout);
    let listed: Vec<(&str, &str, &str)> = envelope
        .volumes
        .iter()
        .map(|volume| {
            (
                volume.name.as_str(),
                volume.path.as_str(),
                volume.scope.as_str(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            ("pip-cache", "/tmp/box-local-s-u/home/.cache/pip", "profile"),
            ("scratch", "/var/cache/scratch", "session"),
        ]
    );
    assert_eq!(envelope.volumes[0].shared_with.as_deref(), Some("dev"));
    assert_eq!(
        envelope.volumes[0].id,
        "/state/box/volumes/local/pip-cache/data"
    );
    let AppliedLimits::Process(limits) = &envelope.limits else {
        panic!("local limits are per process");
    };
    assert!(
        limits
            .not_applied
            .iter()
            .any(|line| line.starts_with("volume pip-cache: no mount namespace")),
        "{:?}",
        limits.not_applied
    );
}
