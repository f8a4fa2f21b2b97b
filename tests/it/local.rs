//! Units on the local sandboxed-process backend, probed from inside: the unit
//! runs a shell probe in place of the executor (`LocalBackend::start_command`,
//! the same helper and confinement path `start` uses) and the test compares
//! what the probe saw with the envelope. Canaries are planted outside the
//! workspace and asserted unreached.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use boxhost::backend::local::{LocalBackend, LocalOptions};
use boxhost::backend::{
    Backend, BackendError, EgressWiring, Envelope, SessionLabel, UnitEnd, UnitWiring,
};
use boxhost::plan::{Limits, NetworkMode, Requirement, Role, UnitSpec, UserIds, WorkspaceSource};
use tokio::io::AsyncReadExt;

use crate::support::{box_bin, box_in_a_pty, commit_all, git, snapshot, under_ci};

/// The units `backend` lists of `session`: `list` also shows every other
/// host process's local units (their run directories), other tests' among
/// them.
async fn listed(backend: &LocalBackend, session: &SessionLabel) -> Vec<boxhost::backend::UnitInfo> {
    use boxhost::backend::Backend as _;
    let mut units = backend.list().await.unwrap();
    units.retain(|unit| unit.session == session.session);
    units
}

fn session(name: &str) -> SessionLabel {
    SessionLabel {
        instance: "local-test".to_owned(),
        session: format!("{name}-{}", std::process::id()),
        profile: "test".to_owned(),
    }
}

fn limits() -> Limits {
    Limits {
        memory_bytes: 512 << 20,
        cpus: 1.0,
        pids: 64,
        tmp_bytes: 64 << 20,
        home_bytes: 64 << 20,
        nofile: 256,
        call_timeout: Duration::from_secs(60),
        idle: Duration::from_secs(60),
        lifetime: Duration::from_secs(60),
        // The rest (the start deadline) as a shipped profile has them.
        ..Limits::default()
    }
}

/// A unit spec on `workspace`, landlock required, network none, as the caller.
fn unit_spec(workspace: &Path) -> UnitSpec {
    UnitSpec {
        root: workspace.to_path_buf(),
        limits: limits(),
        ..UnitSpec::workspace("", WorkspaceSource::Host(workspace.to_path_buf()))
    }
}

/// Landlock must be there on this machine; without it the tests would prove
/// nothing, so say so loudly (and fail under CI).
fn require_landlock() -> bool {
    if box_confine::landlock_abi() > 0 {
        return true;
    }
    eprintln!("LOCAL BACKEND TESTS SKIPPED: this kernel has no landlock");
    assert!(!under_ci(), "landlock is missing under CI");
    false
}

fn backend() -> LocalBackend {
    LocalBackend::new(box_bin())
}

/// A temp directory the unit's user can enter (a root host runs the fork
/// bomb as nobody).
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// What one probe saw, and what the backend said.
struct Probe {
    envelope: Envelope,
    output: String,
    end: UnitEnd,
}

async fn probe_with(backend: &LocalBackend, name: &str, spec: &UnitSpec, script: &str) -> Probe {
    probe_wired(backend, name, spec, &UnitWiring::default(), script).await
}

async fn probe_wired(
    backend: &LocalBackend,
    name: &str,
    spec: &UnitSpec,
    wiring: &UnitWiring,
    script: &str,
) -> Probe {
    // The probe's stderr joins its stdout, so the test sees the shell's errors.
    let script = format!("exec 2>&1; {script}");
    let command: Vec<OsString> = vec!["/bin/sh".into(), "-c".into(), script.into()];
    let started = backend
        .start_command_wired(&session(name), spec, wiring, command)
        .await
        .unwrap_or_else(|error| panic!("starting probe {name}: {error}"));
    let envelope = started.envelope.clone();
    let mut io = started.io;
    drop(io.stdin);
    let mut output = String::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        io.stdout.read_to_string(&mut output),
    )
    .await
    .expect("probe finished within 60s")
    .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(30), started.ended)
        .await
        .expect("unit ended after its probe");
    backend.remove(&envelope.id).await.unwrap();
    eprintln!("probe {name} output:\n{output}\nend: {end:?}");
    Probe {
        envelope,
        output,
        end,
    }
}

async fn probe(name: &str, spec: &UnitSpec, script: &str) -> Probe {
    probe_with(&backend(), name, spec, script).await
}

fn status_field<'a>(output: &'a str, name: &str) -> Option<&'a str> {
    output
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
}

#[tokio::test]
async fn posture_seen_from_inside_matches_the_envelope() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe(
        "posture",
        &spec,
        "cat /proc/self/status /proc/self/limits; echo uid=$(id -u) gid=$(id -g); echo nets: $(ls /sys/class/net)",
    )
    .await;
    for field in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        assert_eq!(
            status_field(&probe.output, field),
            Some("0000000000000000"),
            "{field}"
        );
    }
    assert_eq!(status_field(&probe.output, "NoNewPrivs"), Some("1"));
    let hardening = &probe.envelope.hardening;
    assert!(hardening.capabilities.is_empty());
    assert!(hardening.no_new_privileges);
    assert!(hardening.landlock_enforced);
    assert_eq!(hardening.landlock_abi, box_confine::landlock_abi());
    assert_eq!(hardening.seccomp, "box");
    assert_eq!(status_field(&probe.output, "Seccomp"), Some("2"));
    let (uid, gid) = probe.envelope.user.split_once(':').unwrap();
    assert!(
        probe.output.contains(&format!("uid={uid} gid={gid}")),
        "envelope user {} not what the probe saw",
        probe.envelope.user
    );
    if serde_json::to_value(&probe.envelope.network).unwrap()["namespace"] == true {
        assert!(probe.output.contains("nets: lo\n"), "only lo in the unit");
        assert!(hardening.namespaces.contains(&"net".to_owned()));
    } else {
        assert_eq!(
            serde_json::to_value(&probe.envelope.network).unwrap()["landlockTcpDenied"],
            true
        );
    }
    assert_eq!(
        hardening.user_namespace,
        hardening.namespaces.contains(&"user".to_owned())
    );
    // /proc/self/limits: "Max open files            256                  256                  files".
    let soft_limit = |name: &str| -> u64 {
        let line = probe
            .output
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in /proc/self/limits"));
        line[name.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let limits = serde_json::to_value(&probe.envelope.limits).unwrap();
    for (name, field) in [
        ("Max open files", "nofile"),
        ("Max processes", "pids"),
        ("Max data size", "memoryBytes"),
        ("Max address space", "addressSpaceBytes"),
        ("Max file size", "fileSizeBytes"),
        ("Max core file size", "coreBytes"),
    ] {
        assert_eq!(Some(soft_limit(name)), limits[field].as_u64(), "{name}");
    }
    assert_eq!(probe.end.exit_code, Some(0));
}

#[tokio::test]
async fn writes_land_only_inside_the_workspace() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("existing"), "untouched").unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert(
        "CANARY_DIR".to_owned(),
        outside.path().display().to_string(),
    );
    let probe = probe(
        "writes",
        &spec,
        "echo inside > inside.txt && echo inside-ok; \
         echo x > \"$CANARY_DIR/created\" || echo create-denied; \
         echo y >> \"$CANARY_DIR/existing\" || echo append-denied; \
         mkdir \"$CANARY_DIR/dir\" || echo mkdir-denied; \
         rm \"$CANARY_DIR/existing\" || echo rm-denied; \
         echo tmp > \"$TMPDIR/t\" && echo tmp-ok; \
         mkdir -p \"$HOME/.cache\" && echo x > \"$HOME/.cache/x\" && echo home-ok; \
         echo x > /etc/box-canary || echo etc-denied",
    )
    .await;
    for expected in [
        "inside-ok",
        "create-denied",
        "append-denied",
        "mkdir-denied",
        "rm-denied",
        "tmp-ok",
        "home-ok",
        "etc-denied",
    ] {
        assert!(probe.output.contains(expected), "missing {expected}");
    }
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("inside.txt")).unwrap(),
        "inside\n"
    );
    assert!(!outside.path().join("created").exists());
    assert!(!outside.path().join("dir").exists());
    assert!(!Path::new("/etc/box-canary").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("existing")).unwrap(),
        "untouched"
    );
}

#[tokio::test]
async fn host_secrets_and_the_host_process_are_out_of_reach() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::create_dir_all(home.path().join(".aws")).unwrap();
    std::fs::write(home.path().join(".ssh/id_rsa"), "CANARY-SSH-KEY").unwrap();
    std::fs::write(home.path().join(".aws/credentials"), "CANARY-AWS").unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set
        .insert("FAKE_HOME".to_owned(), home.path().display().to_string());
    spec.env_set
        .insert("HOST_PID".to_owned(), std::process::id().to_string());
    let probe = probe(
        "secrets",
        &spec,
        "cat \"$FAKE_HOME/.ssh/id_rsa\" || echo ssh-denied; \
         cat \"$FAKE_HOME/.aws/credentials\" || echo aws-denied; \
         ls \"$FAKE_HOME\" || echo home-denied; \
         cat /proc/$HOST_PID/environ || echo environ-denied; \
         kill -0 $HOST_PID || echo signal-denied; \
         echo home=$HOME",
    )
    .await;
    assert!(!probe.output.contains("CANARY"), "a canary leaked");
    for expected in [
        "ssh-denied",
        "aws-denied",
        "home-denied",
        "environ-denied",
        "signal-denied",
    ] {
        assert!(probe.output.contains(expected), "missing {expected}");
    }
    assert!(
        !probe
            .output
            .contains(&format!("home={}", home.path().display()))
    );
}

#[tokio::test]
async fn network_none_reaches_nothing_on_the_host() {
    if !require_landlock() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert("PORT".to_owned(), port.to_string());
    let probe = probe(
        "network",
        &spec,
        "python3 -c 'import os, socket; socket.create_connection((\"127.0.0.1\", int(os.environ[\"PORT\"])), 2)' \
         && echo connected || echo connect-failed",
    )
    .await;
    assert!(probe.output.contains("connect-failed"));
    assert!(!probe.output.contains("connected\n"));
    assert_eq!(
        serde_json::to_value(&probe.envelope.network).unwrap()["mode"],
        "none"
    );
}

/// The host's own address on its default route, when it has one (no packet
/// is sent: a UDP socket's connect only picks the route).
fn host_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.254:9").ok()?;
    Some(socket.local_addr().ok()?.ip()).filter(|ip| !ip.is_unspecified())
}

/// Issue 10 on the local backend, from the attacker's side: inside an egress
/// unit, a process that ignores the proxy reaches nothing of the host. TCP and
/// UDP canaries listen on every host address; the unit connects straight to
/// them on loopback and on the host's own address, sends a DNS query to the
/// host's resolver and to the canary, and binds a port of its own. Nothing
/// reaches a canary; only the proxy's socket (bound read-only) is reachable.
#[tokio::test]
async fn an_egress_unit_reaches_nothing_of_the_host_but_its_proxy_socket() {
    if !require_landlock() {
        return;
    }
    assert!(
        Path::new("/usr/bin/python3").is_file(),
        "this test runs /usr/bin/python3 inside the unit: install python3"
    );
    let tcp = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    // The host reaches its own canaries: what fails inside is the unit's doing.
    std::net::TcpStream::connect(("127.0.0.1", tcp_port)).unwrap();
    let _ = tcp.accept().unwrap();
    let host = host_address().map_or("127.0.0.1".to_owned(), |ip| ip.to_string());

    // As the host makes it: the directory and the socket open to the unit's
    // user, whoever that is.
    let sockets = open_dir();
    std::fs::set_permissions(sockets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let proxy = std::os::unix::net::UnixListener::bind(sockets.path().join("proxy.sock")).unwrap();
    std::fs::set_permissions(
        sockets.path().join("proxy.sock"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    proxy.set_nonblocking(true).unwrap();
    let wiring = UnitWiring {
        egress: Some(EgressWiring {
            socket_dir: sockets.path().to_path_buf(),
        }),
        ..UnitWiring::default()
    };
    let workspace = open_dir();
    std::fs::write(
        workspace.path().join("attack.py"),
        r#"import os, socket, sys
tcp, udp, host, proxy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def attempt(name, action):
    try:
        action()
        print(name, "ok")
    except Exception as error:
        print(name, "failed", type(error).__name__, error)
def connect(address):
    socket.create_connection(address, 3).close()
attempt("tcp-loopback", lambda: connect(("127.0.0.1", tcp)))
attempt("tcp-host", lambda: connect((host, tcp)))
attempt("tcp-public", lambda: connect(("1.1.1.1", 443)))
attempt("tcp-bridge-port", lambda: connect(("127.0.0.1", 3128)))
def bind(port):
    s = socket.socket(); s.bind(("127.0.0.1", port)); s.close()
attempt("bind-other", lambda: bind(8080))
attempt("bind-bridge-port", lambda: bind(3128))
def query(address):
    # A DNS query for example.com, sent straight at a resolver.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001"), address)
    s.recvfrom(512)
nameserver = next((line.split()[1] for line in open("/etc/resolv.conf") if line.startswith("nameserver")), "127.0.0.53") if os.path.exists("/etc/resolv.conf") else "127.0.0.53"
attempt("dns-resolver", lambda: query((nameserver, 53)))
attempt("dns-public", lambda: query(("8.8.8.8", 53)))
attempt("udp-host", lambda: query((host, udp)))
attempt("udp-loopback", lambda: query(("127.0.0.1", udp)))
attempt("getaddrinfo", lambda: socket.getaddrinfo("example.com", 443))
def unix():
    s = socket.socket(socket.AF_UNIX); s.connect(proxy); s.close()
attempt("proxy-socket", unix)
attempt("write-socket-dir", lambda: open(os.path.join(os.path.dirname(proxy), "planted"), "w").close())
"#,
    )
    .unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.network.mode = NetworkMode::Egress;
    spec.network.allow = vec!["example.com".to_owned()];
    // As the caller, and (on a root host) as another user the helper switches to.
    let mut users = vec![None];
    if nix::unistd::geteuid().is_root() {
        users.push(Some(UserIds {
            uid: 65534,
            gid: 65534,
        }));
    }
    for user in users {
        spec.user = user;
        egress_attack(&spec, &wiring, (&tcp, &udp, &proxy), &host, sockets.path()).await;
    }
}

async fn egress_attack(
    spec: &UnitSpec,
    wiring: &UnitWiring,
    (tcp, udp, proxy): (
        &std::net::TcpListener,
        &std::net::UdpSocket,
        &std::os::unix::net::UnixListener,
    ),
    host: &str,
    sockets: &Path,
) {
    let (tcp_port, udp_port) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    let script = format!(
        "/usr/bin/python3 attack.py {tcp_port} {udp_port} {host} {}",
        sockets.join("proxy.sock").display()
    );
    let probe = probe_wired(&backend(), "egress-attack", spec, wiring, &script).await;
    let output = &probe.output;
    let line = |name: &str| {
        output
            .lines()
            .find(|line| line.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} line: {output}"))
    };
    for name in [
        "tcp-loopback",
        "tcp-host",
        "tcp-public",
        "dns-resolver",
        "dns-public",
        "udp-host",
        "udp-loopback",
        "getaddrinfo",
        "write-socket-dir",
    ] {
        assert!(line(name).contains(" failed "), "{name}: {output}");
    }
    // Landlock (ABI 4) refuses TCP to any port but the bridge's; the
    // bridge's port is allowed (nobody listens on it in this probe) and
    // bindable. Below ABI 4 the namespace alone stops them.
    let tcp_ports = box_confine::landlock_abi() >= 4;
    if tcp_ports {
        assert!(line("bind-other").contains("PermissionError"), "{output}");
        assert!(line("tcp-loopback").contains("PermissionError"), "{output}");
    }
    assert!(
        line("tcp-bridge-port").contains("ConnectionRefusedError"),
        "{output}"
    );
    assert!(line("bind-bridge-port").ends_with(" ok"), "{output}");
    assert!(line("proxy-socket").ends_with(" ok"), "{output}");
    // Nothing reached a canary.
    assert!(
        tcp.accept()
            .is_err_and(|error| error.kind() == std::io::ErrorKind::WouldBlock),
        "a TCP connection from the unit reached the host"
    );
    let mut buffer = [0u8; 512];
    assert!(
        udp.recv_from(&mut buffer)
            .is_err_and(|error| error.kind() == std::io::ErrorKind::WouldBlock),
        "a UDP datagram from the unit reached the host"
    );
    assert!(!sockets.join("planted").exists());
    // The proxy's socket was reached (by the probe's connect).
    assert!(
        proxy.accept().is_ok(),
        "the unit did not reach its proxy socket"
    );

    assert_eq!(
        probe.envelope.user,
        spec.user.map_or_else(
            || format!("{}:{}", nix::unistd::getuid(), nix::unistd::getgid()),
            |user| format!("{}:{}", user.uid, user.gid)
        )
    );
    let network = serde_json::to_value(&probe.envelope.network).unwrap();
    assert_eq!(network["mode"], "egress", "{network}");
    assert_eq!(network["allow"], serde_json::json!(["example.com"]));
    assert_eq!(network["proxy"], "http://127.0.0.1:3128");
    assert_eq!(network["namespace"], true, "{network}");
    assert_eq!(network["ipSocketsDenied"], false, "{network}");
    if tcp_ports {
        assert_eq!(network["landlockTcpPorts"], serde_json::json!([3128]));
    }
}

/// An egress unit is refused without its proxy, and a proxy is not wired
/// into a unit that did not ask for one.
#[tokio::test]
async fn egress_and_its_wiring_go_together() {
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.network.mode = NetworkMode::Egress;
    spec.network.allow = vec!["example.com".to_owned()];
    let error = backend()
        .start(&session("egress-unwired"), &spec)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&error, BackendError::Unenforceable { control, .. } if control == "network egress allow list"),
        "{error}"
    );
    spec.network.mode = NetworkMode::None;
    let wiring = UnitWiring {
        egress: Some(EgressWiring {
            socket_dir: workspace.path().to_path_buf(),
        }),
        ..UnitWiring::default()
    };
    let error = backend()
        .start_wired(&session("egress-unasked"), &spec, &wiring)
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("not egress"), "{error}");
}

/// What the local backend cannot wire (a masked file for
/// `on_persisted_credentials = "hide"`) is refused by name, never started
/// without.
#[tokio::test]
async fn hidden_files_are_refused_not_ignored() {
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let masked = UnitWiring {
        masks: vec![boxhost::backend::FileMask {
            source: workspace.path().join("copy"),
            target: ".git/config".into(),
        }],
        ..UnitWiring::default()
    };
    let error = backend()
        .start_wired(&session("hide-unwired"), &spec, &masked)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&error, BackendError::Unenforceable { control, .. } if control.contains("hide")),
        "{error}"
    );
}

/// A worktree fork's borrowed objects (issue 11): the unit sees the parent's
/// objects directory at its host path (what the child's alternates name) and
/// reads history through it under landlock, but nothing in the unit can write
/// there: `touch`, `mkdir`, `rm`, and git told to write its objects there all
/// fail, the mount is read-only, and the parent's objects are unchanged. The
/// child's own objects stay writable; nothing else of the parent (its files,
/// the rest of its `.git`) comes into sight. Without a mount namespace of its own
/// the backend refuses to wire them.
#[tokio::test]
async fn borrowed_objects_are_readable_and_never_writable() {
    if !require_landlock() {
        return;
    }
    let parent_dir = tempfile::tempdir().unwrap();
    let parent = std::fs::canonicalize(parent_dir.path()).unwrap();
    std::fs::write(parent.join("a.txt"), "committed in the parent\n").unwrap();
    commit_all(&parent);
    let objects = parent.join(".git/objects");
    // The child borrows the parent's objects by its alternates, as box-fork's
    // worktree child does on this backend.
    let child_dir = tempfile::tempdir().unwrap();
    let child = std::fs::canonicalize(child_dir.path())
        .unwrap()
        .join("child");
    git(
        &parent,
        &[
            "clone",
            "-q",
            "--shared",
            parent.to_str().unwrap(),
            child.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(child.join(".git/objects/info/alternates"))
            .unwrap()
            .trim(),
        objects.to_str().unwrap()
    );
    let before = snapshot(&objects);
    let spec = unit_spec(&child);
    let wiring = UnitWiring {
        objects: Some(boxhost::backend::ObjectsWiring {
            host: objects.clone(),
        }),
        ..UnitWiring::default()
    };
    let script = format!(
        "objects='{objects}'; \
         echo log=$(git log --format=%s -1); \
         echo show=$(git show HEAD:a.txt); \
         touch \"$objects/planted\"; echo touch=$?; \
         mkdir \"$objects/zz\"; echo mkdir=$?; \
         rm -f \"$objects\"/pack/* \"$objects\"/??/*; echo rm=$?; \
         echo evil | GIT_OBJECT_DIRECTORY=\"$objects\" git hash-object -w --stdin; echo hash=$?; \
         echo own | git hash-object -w --stdin >/dev/null; echo own=$?; \
         echo child >> a.txt && git add a.txt && git -c user.name=c -c user.email=c@c commit -qm child; echo commit=$?; \
         echo mount=$(grep -F \" $objects \" /proc/self/mountinfo | tail -n1 | cut -d' ' -f6); \
         echo git-dir=$(ls -A \"$objects/..\" 2>&1); echo parent=$(ls -A \"$objects/../..\" 2>&1)",
        objects = objects.display()
    );
    let probe = probe_wired(&backend(), "objects", &spec, &wiring, &script).await;
    let output = &probe.output;
    assert!(output.contains("log=base"), "{output}");
    assert!(output.contains("show=committed in the parent"), "{output}");
    for refused in ["touch", "mkdir", "rm", "hash"] {
        assert!(
            !output.contains(&format!("{refused}=0")),
            "{refused} wrote into the borrowed objects: {output}"
        );
    }
    assert!(output.contains("own=0"), "{output}");
    assert!(output.contains("commit=0"), "{output}");
    // The topmost mount at the path (the helper's read-only bind).
    let mount = output
        .lines()
        .find_map(|line| line.strip_prefix("mount="))
        .unwrap_or_default();
    assert!(
        mount.split(',').any(|option| option == "ro"),
        "the objects' mount is not read-only: {output}"
    );
    // Only the objects come into sight: not the parent's other files, nor
    // the rest of its `.git` (config, hooks, refs).
    let listed = |name: &str| {
        output
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_default()
    };
    for hidden in ["config", "HEAD", "hooks", "refs"] {
        assert!(!listed("git-dir=").contains(hidden), "{output}");
    }
    assert!(!listed("parent=").contains("a.txt"), "{output}");
    assert_eq!(snapshot(&objects), before, "the parent's objects changed");
    assert_eq!(
        git(&parent, &["for-each-ref", "--format=%(refname)"]),
        "refs/heads/main"
    );

    // No mount namespace, no read-only bind: refused, never started without.
    let flat = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    let error = flat
        .start_wired(&session("objects-flat"), &spec, &wiring)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&error, BackendError::Unenforceable { control, why, .. }
            if control.contains("borrowed git objects") && why.contains("no namespaces")),
        "{error}"
    );
}

/// On a root host RLIMIT_NPROC does not bind uid 0, so the unit runs as nobody.
fn unprivileged(spec: &mut UnitSpec) {
    if nix::unistd::geteuid().is_root() {
        spec.user = Some(UserIds {
            uid: 65534,
            gid: 65534,
        });
    }
}

#[tokio::test]
async fn a_fork_bomb_is_contained_by_the_process_limit() {
    if !require_landlock() {
        return;
    }
    let workspace = open_dir();
    let mut spec = unit_spec(workspace.path());
    unprivileged(&mut spec);
    spec.limits.pids = 16;
    let started = std::time::Instant::now();
    let probe = probe(
        "forkbomb",
        &spec,
        "i=0; while [ $i -lt 64 ]; do sleep 300 & i=$((i+1)); done; echo done-forking",
    )
    .await;
    assert!(
        probe.output.contains("fork") || probe.output.contains("unavailable"),
        "forking past the limit failed"
    );
    assert_eq!(
        serde_json::to_value(&probe.envelope.limits).unwrap()["pids"],
        16
    );
    assert!(
        !serde_json::to_value(&probe.envelope.limits).unwrap()["notApplied"]
            .to_string()
            .contains("RLIMIT_NPROC")
    );
    // The sleeps died with the unit (pid namespace) or its removal.
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn a_file_past_the_size_limit_fails_with_efbig() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.limits.tmp_bytes = 1 << 20;
    let probe = probe(
        "fsize",
        &spec,
        "dd if=/dev/zero of=big bs=65536 count=64 2>&1; echo rc=$?",
    )
    .await;
    assert!(probe.output.contains("File too large"));
    assert!(!probe.output.contains("rc=0"));
    assert_eq!(
        std::fs::metadata(workspace.path().join("big"))
            .unwrap()
            .len(),
        1 << 20
    );
    assert_eq!(
        serde_json::to_value(&probe.envelope.limits).unwrap()["fileSizeBytes"],
        1 << 20
    );
}

#[tokio::test]
async fn open_files_and_memory_are_capped() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.limits.nofile = 64;
    spec.limits.memory_bytes = 256 << 20;
    let probe = probe(
        "nofile-memory",
        &spec,
        "echo nofile=$(ulimit -n); \
         python3 -c 'import os; [os.open(\"/dev/null\", os.O_RDONLY) for _ in range(200)]' 2>&1 | tail -1; \
         python3 -c 'b = bytearray(600 << 20); print(\"allocated\")' 2>&1 | tail -1",
    )
    .await;
    assert!(probe.output.contains("nofile=64"));
    assert!(probe.output.contains("Too many open files"));
    assert!(probe.output.contains("MemoryError"));
    assert!(!probe.output.contains("allocated"));
    assert_eq!(
        serde_json::to_value(&probe.envelope.limits).unwrap()["nofile"],
        64
    );
    assert_eq!(
        serde_json::to_value(&probe.envelope.limits).unwrap()["memoryBytes"],
        256 << 20
    );
}

#[tokio::test]
async fn the_end_names_the_exit_code_or_the_signal() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let exited = probe("exit-code", &spec, "exit 7").await;
    assert_eq!(exited.end.exit_code, Some(7));
    assert_eq!(exited.end.reason, "the executor exited with code 7");
    let killed = probe("signal", &spec, "kill -KILL $$").await;
    assert_eq!(killed.end.exit_code, Some(-1));
    assert!(
        killed.end.reason.contains("SIGKILL"),
        "{}",
        killed.end.reason
    );
}

#[tokio::test]
async fn a_required_landlock_abi_the_kernel_lacks_refuses_to_start() {
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::BestEffort,
        landlock_min_abi: 99,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    let session = session("refuse");
    let command = vec![OsString::from("/bin/sh"), "-c".into(), "touch ran".into()];
    let error = backend
        .start_command(&session, &spec, command)
        .await
        .err()
        .expect("start refused");
    assert!(
        matches!(&error, BackendError::Unenforceable { control, .. } if control == "landlock (ABI 99)"),
        "{error}"
    );
    assert!(error.to_string().contains("unit workspace"), "{error}");
    assert!(!workspace.path().join("ran").exists(), "the command ran");
    assert!(leftover_temp_dirs(&session).is_empty());
    assert!(listed(&backend, &session).await.is_empty());
}

#[tokio::test]
async fn the_helper_alone_refuses_a_missing_control_before_running_anything() {
    // The helper run by hand, as the backend runs it: the report goes to stderr.
    let workspace = tempfile::tempdir().unwrap();
    let spec = serde_json::json!({
        "unit": "direct", "write": [workspace.path()], "read": [], "cwd": workspace.path(),
        "network": "none", "user": null,
        "rlimits": {"nofile": 64, "nproc": 64, "dataBytes": 1u64 << 30,
                    "addressSpaceBytes": 2u64 << 30, "fsizeBytes": 1u64 << 20, "coreBytes": 0},
        "landlock": "required", "landlockMinAbi": 99, "namespaces": "best-effort",
        "env": [["PATH", "/usr/bin:/bin"]]
    });
    let output = std::process::Command::new(box_bin())
        .arg("sandbox")
        .arg("--spec")
        .arg(spec.to_string())
        .arg("--")
        .arg("/usr/bin/touch")
        .arg(workspace.path().join("ran"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("\"event\":\"refused\""), "{stderr}");
    assert!(stderr.contains("landlock (ABI 99) is required"), "{stderr}");
    assert!(!workspace.path().join("ran").exists());
}

fn leftover_temp_dirs(session: &SessionLabel) -> Vec<PathBuf> {
    let prefix = format!("box-local-{}-", session.session);
    std::fs::read_dir(boxhost::backend::local::default_temp_root())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

/// The `sleep` processes on this machine whose command line carries `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|byte| byte.is_ascii_digit())
        })
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.starts_with("sleep ") && cmdline.contains(marker)).then_some(cmdline)
        })
        .collect()
}

#[tokio::test]
async fn remove_leaves_no_process_and_no_temp_dir_and_is_idempotent() {
    if !require_landlock() {
        return;
    }
    remove_leaves_nothing(backend(), "remove").await;
}

/// Without a pid namespace (as inside a container) the helper's subreaper
/// duty is what catches a process that left the unit's process group.
#[tokio::test]
async fn remove_leaves_no_process_without_a_pid_namespace() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    remove_leaves_nothing(backend, "remove-flat").await;
}

async fn remove_leaves_nothing(backend: LocalBackend, name: &str) {
    let session = session(name);
    let mut spec = unit_spec(Path::new("/nonexistent"));
    spec.source = WorkspaceSource::Empty;
    // A grandchild in its own session and process group, which a process
    // group kill alone would miss.
    let marker = format!("98{}{}", name.len(), std::process::id());
    let script = format!("setsid sleep {marker} & sleep {marker}");
    let command = vec![OsString::from("/bin/sh"), "-c".into(), script.into()];
    let started = backend
        .start_command(&session, &spec, command)
        .await
        .unwrap();
    let id = started.envelope.id.clone();
    let temp = PathBuf::from(&started.envelope.root)
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(temp.is_dir());
    assert_eq!(leftover_temp_dirs(&session), vec![temp.clone()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processes_with(&marker).len(), 2);
    let units = listed(&backend, &session).await;
    assert_eq!(units.len(), 1);
    assert_eq!(units[0].id, id);
    assert_eq!(units[0].session, session.session);
    assert_eq!(units[0].state, "running");

    backend.remove(&id).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), started.ended)
        .await
        .unwrap();
    assert!(
        end.reason.starts_with("the unit was removed"),
        "{}",
        end.reason
    );
    assert!(!Path::new(&format!("/proc/{id}")).exists());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    assert!(!temp.exists());
    backend.remove(&id).await.unwrap();
    backend.remove("no-such-unit").await.unwrap();
    assert!(listed(&backend, &session).await.is_empty());
}

#[tokio::test]
async fn start_runs_the_executor_confined() {
    if !require_landlock() {
        return;
    }
    executor_serves_confined(backend(), "start").await;
}

/// Without a pid namespace the helper stays as the unit's supervisor, and
/// its forked child runs the executor the same way.
#[tokio::test]
async fn start_runs_the_executor_confined_without_namespaces() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    executor_serves_confined(backend, "start-no-ns").await;
}

/// Start the real executor in a unit of `backend`, speak MCP to it, and see
/// its bash confined; the executor is the helper's forked child, run in
/// place, not a second exec of box (issue 8, item 17).
async fn executor_serves_confined(backend: LocalBackend, name: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert(
        "CANARY_DIR".to_owned(),
        outside.path().display().to_string(),
    );
    let started = backend.start(&session(name), &spec).await.unwrap();
    let envelope = started.envelope.clone();
    assert_eq!(envelope.backend, boxhost::backend::BackendKind::Local);
    assert_eq!(
        envelope.root,
        std::fs::canonicalize(workspace.path())
            .unwrap()
            .display()
            .to_string()
    );
    assert!(envelope.hardening.landlock_enforced);
    assert!(envelope.hardening.no_new_privileges);

    // Speak MCP to the real executor over the unit's stdio.
    let mut stdin = started.io.stdin;
    let mut lines = tokio::io::BufReader::new(started.io.stdout).lines();
    let mut request = async |message: serde_json::Value| {
        let mut line = message.to_string();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
        if message.get("id").is_none() {
            return serde_json::Value::Null;
        }
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("the executor answers")
                .unwrap()
                .expect("the executor keeps stdout open");
            let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
            if answer.get("id") == message.get("id") {
                return answer;
            }
        }
    };
    let initialized = request(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "local-test", "version": "1"}}}),
    )
    .await;
    assert!(
        initialized["result"]["capabilities"].is_object(),
        "{initialized}"
    );
    request(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let called = request(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command":
            "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
             echo x > \"$CANARY_DIR/escaped\" || echo outside-denied; \
             echo ok > inside.txt && echo inside-ok; \
             echo executor: $(tr '\\0' ' ' < /proc/$PPID/cmdline)"}}}),
    )
    .await;
    let text = called["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    eprintln!("bash in the local unit said:\n{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{called}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{called}");
    assert!(text.contains("Seccomp:\t2"), "{called}");
    assert!(text.contains("outside-denied"), "{called}");
    assert!(text.contains("inside-ok"), "{called}");
    let executor = text
        .lines()
        .find_map(|line| line.strip_prefix("executor: "))
        .unwrap_or_default();
    assert!(
        executor.contains(" sandbox ") && executor.contains(" -- "),
        "the executor is not the helper's own process: {executor}"
    );
    assert!(!outside.path().join("escaped").exists());
    assert!(workspace.path().join("inside.txt").exists());

    // Hanging up ends the executor, and with it the unit.
    drop(stdin);
    let end = tokio::time::timeout(Duration::from_secs(30), started.ended)
        .await
        .expect("the unit ended after its executor's stdin closed");
    assert_eq!(end.exit_code, Some(0), "{}", end.reason);
    backend.remove(&envelope.id).await.unwrap();
}

/// Inside a container (as on CI runners) namespaces are often blocked: the
/// unit then rests on landlock alone, and its envelope says so.
#[tokio::test]
async fn without_namespaces_landlock_alone_confines_the_unit() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "CANARY-OUTSIDE").unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert(
        "PORT".to_owned(),
        listener.local_addr().unwrap().port().to_string(),
    );
    spec.env_set
        .insert("HOST_PID".to_owned(), std::process::id().to_string());
    spec.env_set.insert(
        "CANARY_DIR".to_owned(),
        outside.path().display().to_string(),
    );
    let probe = probe_with(
        &backend,
        "no-namespaces",
        &spec,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; \
         python3 -c 'import os, socket; socket.create_connection((\"127.0.0.1\", int(os.environ[\"PORT\"])), 2)' \
         && echo connected || echo connect-failed; \
         python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)' 2>/dev/null \
         && echo udp-socket-made || echo udp-denied; \
         test -d /proc/$HOST_PID && echo host-pid-visible; \
         cat /proc/$HOST_PID/environ || echo environ-denied; \
         kill -0 $HOST_PID || echo signal-denied; \
         kill -0 $PPID || echo supervisor-signal-denied; \
         cat \"$CANARY_DIR/secret\" || echo read-denied; \
         echo x > \"$CANARY_DIR/new\" || echo write-denied",
    )
    .await;
    let hardening = &probe.envelope.hardening;
    assert!(hardening.namespaces.is_empty());
    // Honest about what landlock alone cannot do.
    assert!(
        serde_json::to_value(&probe.envelope.limits).unwrap()["notApplied"]
            .to_string()
            .contains("host directories")
    );
    assert!(!hardening.user_namespace);
    assert_eq!(
        serde_json::to_value(&probe.envelope.network).unwrap()["namespace"],
        false
    );
    assert_eq!(
        serde_json::to_value(&probe.envelope.network).unwrap()["landlockTcpDenied"],
        true
    );
    assert_eq!(
        serde_json::to_value(&probe.envelope.network).unwrap()["ipSocketsDenied"],
        true
    );
    assert_eq!(
        status_field(&probe.output, "CapEff"),
        Some("0000000000000000")
    );
    assert_eq!(status_field(&probe.output, "NoNewPrivs"), Some("1"));
    if nix::unistd::geteuid().is_root() {
        // Root could drop its bounding set; so the envelope's empty list is exact.
        assert_eq!(
            status_field(&probe.output, "CapBnd"),
            Some("0000000000000000")
        );
    }
    assert!(probe.output.contains("host-pid-visible"));
    for expected in [
        "connect-failed",
        "udp-denied",
        "environ-denied",
        "signal-denied",
        "read-denied",
        "write-denied",
    ] {
        assert!(probe.output.contains(expected), "missing {expected}");
    }
    if box_confine::landlock_abi() >= 6 {
        assert!(probe.output.contains("supervisor-signal-denied"));
    }

    assert!(!probe.output.contains("CANARY"));
    assert!(!outside.path().join("new").exists());
}

#[tokio::test]
async fn required_namespaces_are_entered_here() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Required,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    match backend
        .start_command(&session("required-ns"), &spec, vec!["/bin/true".into()])
        .await
    {
        Ok(started) => {
            let namespaces = &started.envelope.hardening.namespaces;
            for name in ["user", "mount", "ipc", "net", "pid"] {
                assert!(namespaces.contains(&name.to_owned()), "{name} missing");
            }
            backend.remove(&started.envelope.id).await.unwrap();
        }
        Err(error) => {
            // Where the kernel or a container forbids them, the refusal names the control.
            assert!(
                matches!(&error, BackendError::Unenforceable { control, .. } if control == "namespaces"),
                "{error}"
            );
            eprintln!("NOTE: namespaces are unavailable here: {error}");
        }
    }
}

#[tokio::test]
async fn stdio_is_the_commands_alone_after_the_report() {
    if !require_landlock() {
        return;
    }
    use tokio::io::AsyncWriteExt;
    let backend = backend();
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let command = vec![OsString::from("/bin/cat")];
    let started = backend
        .start_command(&session("stdio"), &spec, command)
        .await
        .unwrap();
    let mut io = started.io;
    io.stdin
        .write_all(b"{\"jsonrpc\":\"2.0\"}\n")
        .await
        .unwrap();
    io.stdin.shutdown().await.unwrap();
    drop(io.stdin);
    let mut output = String::new();
    io.stdout.read_to_string(&mut output).await.unwrap();
    assert_eq!(output, "{\"jsonrpc\":\"2.0\"}\n");
    let end = started.ended.await;
    assert_eq!(end.exit_code, Some(0));
    backend.remove(&started.envelope.id).await.unwrap();
}

#[tokio::test]
async fn the_unit_ends_with_its_command_even_when_children_linger() {
    if !require_landlock() {
        return;
    }
    let backend = backend();
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let command = vec![
        OsString::from("/bin/sh"),
        "-c".into(),
        "sleep 1000 & exit 3".into(),
    ];
    let started = backend
        .start_command(&session("linger"), &spec, command)
        .await
        .unwrap();
    let mut io = started.io;
    let mut output = Vec::new();
    // The lingering sleep holds stdout; it must die with the command.
    tokio::time::timeout(Duration::from_secs(10), io.stdout.read_to_end(&mut output))
        .await
        .expect("stdout closed when the command ended")
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), started.ended)
        .await
        .unwrap();
    assert_eq!(end.exit_code, Some(3));
    backend.remove(&started.envelope.id).await.unwrap();
}

/// The catalogue's runtime-escape cases that apply to a process unit
/// (C28–C30, C33, C38, C40): each must fail inside, nothing may change
/// outside. Docker's masked kernel files are masked here too.
#[tokio::test]
async fn runtime_escape_attempts_fail_inside_the_unit() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe(
        "escape",
        &spec,
        "unshare -U true && echo userns-created || echo userns-denied; \
         unshare -r true && echo root-map-created || echo root-map-denied; \
         unshare -m true && echo mountns-created || echo mountns-denied; \
         mkdir -p m; mount -t proc proc m && echo proc-mounted || echo mount-denied; \
         mount --bind /etc m && echo bind-mounted || echo bind-denied; \
         echo 1 > /sys/fs/cgroup/release_agent && echo cgroup-written || echo cgroup-denied; \
         echo h > /proc/sysrq-trigger && echo sysrq-written || echo sysrq-denied; \
         echo '|/tmp/x' > /proc/sys/kernel/core_pattern && echo core-pattern-written || echo core-pattern-denied; \
         head -c 1 /proc/kcore > /dev/null && echo kcore-read || echo kcore-denied; \
         head -c 1 /proc/timer_list 2>/dev/null | grep -q . && echo timer-list-read || echo timer-list-denied; \
         ls /sys/firmware 2>/dev/null | grep -q . && echo firmware-listed || echo firmware-denied; \
         head -c 1 /dev/kmsg > /dev/null && echo kmsg-read || echo kmsg-denied; \
         head -c 1 /dev/mem > /dev/null && echo mem-read || echo mem-denied; \
         for disk in /dev/sda /dev/vda /dev/nvme0n1; do test -e $disk && { head -c 1 $disk > /dev/null && echo disk-read || echo disk-denied; }; done; \
         echo x > /usr/bin/box-canary && echo usr-written || echo usr-denied; \
         echo x >> /etc/passwd && echo passwd-written || echo passwd-denied; \
         head -c 1 /dev/urandom > /dev/null && echo urandom-read",
    )
    .await;
    for denied in [
        "userns-denied",
        "root-map-denied",
        "mountns-denied",
        "mount-denied",
        "bind-denied",
        "cgroup-denied",
        "sysrq-denied",
        "core-pattern-denied",
        "kcore-denied",
        "timer-list-denied",
        "firmware-denied",
        "kmsg-denied",
        "mem-denied",
        "usr-denied",
        "passwd-denied",
        "urandom-read",
    ] {
        assert!(probe.output.contains(denied), "missing {denied}");
    }
    for escaped in [
        "userns-created",
        "root-map-created",
        "mountns-created",
        "proc-mounted",
        "bind-mounted",
        "cgroup-written",
        "sysrq-written",
        "core-pattern-written",
        "kcore-read",
        "timer-list-read",
        "firmware-listed",
        "kmsg-read",
        "mem-read",
        "disk-read",
        "usr-written",
        "passwd-written",
    ] {
        assert!(!probe.output.contains(escaped), "{escaped}");
    }
    assert!(!Path::new("/usr/bin/box-canary").exists());
}

/// Local units die with their host: the helper carries the parent-death
/// signal, the init carries it from the helper, and the pid namespace takes
/// every process with it.
#[tokio::test]
async fn units_die_with_their_host() {
    if !require_landlock() {
        return;
    }
    for (namespaces, tag) in [("best-effort", 1), ("off", 2)] {
        unit_dies_with_its_host(namespaces, tag).await;
    }
}

async fn unit_dies_with_its_host(namespaces: &str, tag: u32) {
    let workspace = tempfile::tempdir().unwrap();
    let marker = format!("975{tag}{}", std::process::id());
    let spec = serde_json::json!({
        "unit": "orphan", "write": [workspace.path()], "read": [], "cwd": workspace.path(),
        "network": "none", "user": null,
        "rlimits": {"nofile": 64, "nproc": 64, "dataBytes": 1u64 << 30,
                    "addressSpaceBytes": 2u64 << 30, "fsizeBytes": 1u64 << 20, "coreBytes": 0},
        "landlock": "required", "landlockMinAbi": 1, "namespaces": namespaces,
        "env": [["PATH", "/usr/bin:/bin"]]
    });
    // A stand-in host: a shell whose child is the helper.
    let script = format!(
        "{} sandbox --spec '{}' --parent $$ -- /bin/sh -c 'setsid sleep {marker} & sleep {marker}' 2>/dev/null & wait",
        box_bin().display(),
        spec
    );
    let mut host = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        processes_with(&marker).len(),
        2,
        "the unit started ({namespaces})"
    );
    host.kill().unwrap();
    host.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !processes_with(&marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        processes_with(&marker),
        Vec::<String>::new(),
        "{namespaces}"
    );
}

/// C31, C32, C34: the syscalls and socket families a unit never needs are
/// refused inside it, by box's seccomp filter.
#[tokio::test]
async fn kernel_attack_surface_is_refused_inside_the_unit() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(
        workspace.path().join("probe.py"),
        r#"
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    return "ok" if result != -1 else str(ctypes.get_errno())
for name, number, args in [
    ("keyctl", 250, (0, -3, 0)),
    ("add_key", 248, (0, 0, 0, 0, 0)),
    ("bpf", 321, (0, 0, 0)),
    ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("userfaultfd", 323, (0,)),
    ("io_uring_setup", 425, (1, 0)),
    ("open_by_handle_at", 304, (0, 0, 0)),
    ("init_module", 175, (0, 0, 0)),
    ("kexec_load", 246, (0, 0, 0, 0)),
    ("ptrace", 101, (16, os.getppid(), 0, 0)),
    ("process_vm_readv", 310, (os.getppid(), 0, 0, 0, 0, 0)),
]:
    print(name, errno_of(number, *args))
for name, family in [("AF_ALG", 38), ("AF_VSOCK", 40)]:
    try:
        socket.socket(family, socket.SOCK_SEQPACKET if family == 38 else socket.SOCK_STREAM, 0)
        print(name, "ok")
    except OSError as error:
        print(name, error.errno)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
print("inet ok")
"#,
    )
    .unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe("surface", &spec, "python3 probe.py").await;
    for name in [
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "open_by_handle_at",
        "init_module",
        "kexec_load",
        "ptrace",
        "process_vm_readv",
        "AF_ALG",
        "AF_VSOCK",
    ] {
        assert!(
            probe.output.contains(&format!("{name} 1\n")),
            "{name} was not refused with EPERM"
        );
    }
    assert!(probe.output.contains("inet ok"));
    assert_eq!(probe.envelope.hardening.seccomp, "box");
}

/// A start whose future is dropped (a session hanging up mid-start) leaves
/// neither a process nor a temp directory behind, wherever it was cut off.
#[tokio::test]
async fn a_cancelled_start_leaves_nothing_behind() {
    if !require_landlock() {
        return;
    }
    let backend = backend();
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    for (attempt, micros) in [0u64, 300, 700, 1200, 2000, 3000].into_iter().enumerate() {
        let session = session(&format!("cancel{attempt}"));
        let marker = format!("96{attempt}{}", std::process::id());
        let command = vec![
            OsString::from("/bin/sh"),
            "-c".into(),
            format!("setsid sleep {marker} & sleep {marker}").into(),
        ];
        let start = backend.start_command(&session, &spec, command);
        if let Ok(Ok(started)) = tokio::time::timeout(Duration::from_micros(micros), start).await {
            backend.remove(&started.envelope.id).await.unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (!processes_with(&marker).is_empty() || !leftover_temp_dirs(&session).is_empty())
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            processes_with(&marker),
            Vec::<String>::new(),
            "attempt {attempt}"
        );
        assert_eq!(
            leftover_temp_dirs(&session),
            Vec::<PathBuf>::new(),
            "attempt {attempt}"
        );
    }
    let mine = format!("-{}", std::process::id());
    let left: Vec<_> = {
        use boxhost::backend::Backend as _;
        let mut units = backend.list().await.unwrap();
        units.retain(|unit| unit.session.starts_with("cancel") && unit.session.ends_with(&mine));
        units
    };
    assert!(left.is_empty(), "{left:?}");
}

/// `box run --backend local`: the front door, end to end on this backend.
#[test]
fn box_run_on_the_local_backend_streams_output_and_passes_the_status() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let script = format!(
        "echo hello > greeting && cat greeting; \
         grep -E '^NoNewPrivs:' /proc/self/status; \
         echo x > {}/escaped || echo outside-denied; exit 3",
        outside.path().display()
    );
    let output = std::process::Command::new(box_bin())
        .args(["run", "--backend", "local", "--workspace"])
        .arg(workspace.path())
        .args(["--", "/bin/sh", "-c", &script])
        .current_dir(workspace.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(3),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stdout.contains("hello\n"), "{stdout}");
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(stdout.contains("outside-denied"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("greeting")).unwrap(),
        "hello\n"
    );
    assert!(!outside.path().join("escaped").exists());
}

/// C37, F69, G80: Unix sockets of the host (the Docker API, an SSH agent)
/// are not there to connect to. Landlock before ABI 9 cannot refuse a
/// `connect` by path, so the unit's mount namespace hides every host
/// directory it has no business in.
#[tokio::test]
async fn host_unix_sockets_are_out_of_reach() {
    if !require_landlock() {
        return;
    }
    let sockets = tempfile::tempdir().unwrap();
    let agent = sockets.path().join("agent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&agent).unwrap();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(
        workspace.path().join("connect.py"),
        r#"
import socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as error:
        print("refused", path, error.errno)
"#,
    )
    .unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set
        .insert("AGENT".to_owned(), agent.display().to_string());
    let probe = probe(
        "sockets",
        &spec,
        "python3 connect.py \"$AGENT\" /var/run/docker.sock /run/docker.sock",
    )
    .await;
    assert!(
        !probe.output.contains("CONNECTED"),
        "a host socket was reached"
    );
    assert!(
        probe
            .output
            .contains(&format!("refused {}", agent.display()))
    );
    if probe
        .envelope
        .hardening
        .namespaces
        .contains(&"mount".to_owned())
    {
        assert!(
            !serde_json::to_value(&probe.envelope.limits).unwrap()["notApplied"]
                .to_string()
                .contains("host directories")
        );
    }
    // The host still reaches its own socket: nothing was changed outside.
    std::os::unix::net::UnixStream::connect(&agent).unwrap();
}

/// A unit on the host's network (a profile's bridge network, on this
/// backend) still reads the resolver configuration, wherever it links to.
#[tokio::test]
async fn host_network_units_keep_the_resolver_configuration() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.network.mode = NetworkMode::Bridge;
    let probe = probe(
        "resolver",
        &spec,
        "cat /etc/resolv.conf > /dev/null && echo resolver-readable",
    )
    .await;
    assert!(probe.output.contains("resolver-readable"));
    assert_eq!(
        serde_json::to_value(&probe.envelope.network).unwrap()["mode"],
        "host"
    );
    assert!(
        !probe
            .envelope
            .hardening
            .namespaces
            .contains(&"net".to_owned())
    );
}

/// C41: started from a terminal, a unit has no controlling terminal of its
/// own, so nothing in it can open `/dev/tty` and push keystrokes into the
/// terminal `box` runs in.
#[test]
fn a_unit_started_from_a_terminal_cannot_reach_it() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let driver = r#"
import os, pty, sys
box, workspace = sys.argv[1], sys.argv[2]
script = "(echo injected > /dev/tty) 2>/dev/null && echo TTY-REACHED || echo no-controlling-tty"
pid, fd = pty.fork()
if pid == 0:
    os.execv(box, [box, "run", "--backend", "local", "--workspace", workspace, "--", "/bin/sh", "-c", script])
out = b""
while True:
    try:
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data:
        break
    out += data
os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
"#;
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(driver)
        .arg(box_bin())
        .arg(workspace.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("no-controlling-tty"), "{stdout}");
    assert!(!stdout.contains("TTY-REACHED"), "{stdout}");
    assert!(!stdout.contains("injected"), "{stdout}");
}

/// A unit that is the host's uid 0 (a root host, the plan's default user)
/// cannot read what only root may: `/etc/shadow`, private keys.
#[tokio::test]
async fn root_only_host_files_stay_unread() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe(
        "root-only",
        &spec,
        "echo shadow:; cat /etc/shadow; echo gshadow:; cat /etc/gshadow; echo private:; ls /etc/ssl/private; echo end",
    )
    .await;
    assert!(!probe.output.contains("root:"), "/etc/shadow was read");
    assert!(!probe.output.contains(".key"), "a private key was listed");
    if nix::unistd::geteuid().is_root()
        && probe
            .envelope
            .hardening
            .namespaces
            .contains(&"mount".to_owned())
    {
        assert!(
            !serde_json::to_value(&probe.envelope.limits).unwrap()["notApplied"]
                .to_string()
                .contains("root-only host files")
        );
    }
}

/// The host's terminals are not a unit's to write to: it gets a
/// pseudo-terminal file system of its own (or none), so a terminal the host
/// has open is not there, while the unit can still open terminals of its own.
#[tokio::test]
async fn host_terminals_are_out_of_reach() {
    if !require_landlock() {
        return;
    }
    let terminal = nix::pty::openpty(None, None).unwrap();
    let host_pts = nix::unistd::ttyname(&terminal.slave).unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set
        .insert("HOST_PTS".to_owned(), host_pts.display().to_string());
    let probe = probe(
        "terminals",
        &spec,
        "echo injected > \"$HOST_PTS\" && echo HOST-TERMINAL-WRITTEN || echo host-terminal-denied; \
         python3 -c 'import os; os.openpty(); print(\"own-pty-ok\")' 2>&1 | tail -1",
    )
    .await;
    assert!(probe.output.contains("host-terminal-denied"));
    assert!(!probe.output.contains("HOST-TERMINAL-WRITTEN"));
    if probe
        .envelope
        .hardening
        .namespaces
        .contains(&"mount".to_owned())
    {
        assert!(probe.output.contains("own-pty-ok"));
    }
    // Nothing arrived on the host's terminal.
    nix::fcntl::fcntl(
        &terminal.master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buffer = [0u8; 64];
    assert!(nix::unistd::read(&terminal.master, &mut buffer).is_err());
}

/// An fd the host holds without close-on-exec (inherited from a CI runner, a
/// shell) never reaches the unit.
#[tokio::test]
async fn fds_the_host_leaks_do_not_reach_the_unit() {
    if !require_landlock() {
        return;
    }
    // A pipe without close-on-exec, as a careless parent would hand down.
    let (read, write) = nix::unistd::pipe().unwrap();
    use std::os::fd::AsRawFd;
    let leaked = [read.as_raw_fd(), write.as_raw_fd()];
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe("fds", &spec, "echo fds: $(ls /proc/self/fd | tr '\\n' ' ')").await;
    let line = probe
        .output
        .lines()
        .find(|line| line.starts_with("fds:"))
        .unwrap();
    let fds: Vec<i32> = line[4..]
        .split_whitespace()
        .map(|fd| fd.parse().unwrap())
        .collect();
    // 0, 1, 2 and the directory `ls` reads, nothing more.
    assert!(fds.len() <= 4, "{line}");
    for fd in leaked {
        if fd > 3 {
            assert!(!fds.contains(&fd), "fd {fd} leaked into the unit: {line}");
        }
    }
    drop((read, write));
}

/// A server unit has no workspace; its executor still starts and answers,
/// with its root in the unit's private temp, nothing of the host's.
#[tokio::test]
async fn a_server_unit_without_a_workspace_serves() {
    if !require_landlock() {
        return;
    }
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let backend = backend();
    let mut spec = unit_spec(Path::new("/nonexistent"));
    spec.name = "server".to_owned();
    spec.role = Role::Server;
    spec.source = WorkspaceSource::None;
    let started = backend.start(&session("server"), &spec).await.unwrap();
    assert_eq!(started.envelope.role, boxhost::plan::Role::Server);
    assert_eq!(started.envelope.root, "");
    let mut stdin = started.io.stdin;
    let mut lines = tokio::io::BufReader::new(started.io.stdout).lines();
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "local-test", "version": "1"}}});
    stdin
        .write_all(format!("{initialize}\n").as_bytes())
        .await
        .unwrap();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the executor answers")
        .unwrap()
        .expect("the executor keeps stdout open");
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(answer["result"]["capabilities"].is_object(), "{answer}");
    drop(stdin);
    let end = tokio::time::timeout(Duration::from_secs(30), started.ended)
        .await
        .unwrap();
    assert_eq!(end.exit_code, Some(0), "{}", end.reason);
    backend.remove(&started.envelope.id).await.unwrap();
}

/// Units started together each get their own confinement, and removing them
/// together leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_start_and_go_together() {
    if !require_landlock() {
        return;
    }
    let backend = std::sync::Arc::new(backend());
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let session = session("together");
    let starts = (0..8).map(|index| {
        let backend = std::sync::Arc::clone(&backend);
        let spec = spec.clone();
        let session = session.clone();
        async move {
            let command = vec![
                OsString::from("/bin/sh"),
                "-c".into(),
                format!("echo {index} > unit-{index}; exec sleep 600").into(),
            ];
            backend.start_command(&session, &spec, command).await
        }
    });
    let started: Vec<_> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let ids: std::collections::BTreeSet<_> = started
        .iter()
        .map(|unit| unit.envelope.id.clone())
        .collect();
    assert_eq!(ids.len(), 8);
    assert_eq!(listed(&backend, &session).await.len(), 8);
    for unit in &started {
        assert!(unit.envelope.hardening.landlock_enforced);
    }
    let removals = ids.iter().map(|id| backend.remove(id));
    for removed in futures::future::join_all(removals).await {
        removed.unwrap();
    }
    assert!(listed(&backend, &session).await.is_empty());
    assert_eq!(leftover_temp_dirs(&session), Vec::<PathBuf>::new());
    for id in &ids {
        assert!(
            !Path::new(&format!("/proc/{id}")).exists(),
            "helper {id} left"
        );
    }
}

/// C27: a setuid-root binary on the host (`su`) runs in a unit with the
/// unit's uids: no_new_privs leaves the effective uid unchanged. The probe
/// starts `su` waiting for a password and reads the uids the kernel gave it
/// (`Uid: real effective saved fs`).
#[tokio::test]
async fn setuid_binaries_do_not_raise_the_effective_uid() {
    if !require_landlock() {
        return;
    }
    let workspace = open_dir();
    let mut spec = unit_spec(workspace.path());
    unprivileged(&mut spec);
    let probe = probe(
        "setuid",
        &spec,
        "stat -c 'su=%u:%a' /usr/bin/su; \
         sleep 3 | su root -c id >/dev/null 2>&1 & sleep 1; grep -E '^Uid:' /proc/$!/status; wait; \
         echo uid=$(id -u)",
    )
    .await;
    assert!(probe.envelope.hardening.no_new_privileges);
    // The fixture is live: su carries the setuid bit. Its owner reads as
    // root, or as the overflow uid inside a user namespace where the host's
    // root is unmapped (then the kernel ignores the bit as well).
    assert!(probe.output.contains(":4755"), "{}", probe.output);
    let uid = probe
        .output
        .lines()
        .find_map(|line| line.strip_prefix("uid="))
        .unwrap_or_default();
    assert_ne!(uid, "0", "the unit runs unprivileged: {}", probe.output);
    let uids = status_field(&probe.output, "Uid").unwrap_or_default();
    assert_eq!(
        uids.split_whitespace().collect::<Vec<_>>(),
        vec![uid; 4],
        "{}",
        probe.output
    );
}

/// Issue 8, item 3: a workspace that is itself a top-level host directory
/// (`/tmp`, `/root`: what `box run` from there resolves `cwd` to) starts, stays
/// in sight whole, and every other host directory is still hidden.
#[tokio::test]
async fn a_top_level_directory_as_the_workspace_starts_and_the_rest_stays_hidden() {
    if !require_landlock() {
        return;
    }
    // A canary in another hidden top-level directory (`/var`).
    let elsewhere = tempfile::Builder::new()
        .prefix("box-hidden-canary")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(elsewhere.path().join("canary"), "elsewhere").unwrap();
    let mut tops = vec!["/tmp"];
    if nix::unistd::geteuid().is_root() {
        tops.push("/root");
    }
    for top in tops {
        let workspace = Path::new(top);
        let canary = tempfile::Builder::new()
            .prefix("box-top-canary")
            .tempfile_in(workspace)
            .unwrap();
        std::fs::write(canary.path(), "in-workspace").unwrap();
        let spec = unit_spec(workspace);
        let probe = probe(
            &format!("top-level{}", top.replace('/', "-")),
            &spec,
            &format!(
                "cat {}; echo; cat {}/canary || echo elsewhere-hidden",
                canary.path().display(),
                elsewhere.path().display()
            ),
        )
        .await;
        assert_eq!(probe.end.exit_code, Some(0), "{top}: {}", probe.output);
        assert!(
            probe.output.contains("in-workspace"),
            "{top}: {}",
            probe.output
        );
        assert_eq!(probe.envelope.root, top);
        if probe
            .envelope
            .hardening
            .namespaces
            .contains(&"mount".to_owned())
        {
            assert!(
                probe.output.contains("elsewhere-hidden") && !probe.output.contains("elsewhere\n"),
                "{top}: a host directory beside the workspace was in sight: {}",
                probe.output
            );
        }
    }
}

/// Issue 8, item 3: the host's root as the workspace (only where an operator
/// allowed it: the plan refuses `/` as dangerous) hides nothing, and the
/// envelope says so instead of claiming the host is out of sight.
#[tokio::test]
async fn the_hosts_root_as_the_workspace_hides_nothing_and_says_so() {
    if !require_landlock() {
        return;
    }
    let mut spec = unit_spec(Path::new("/"));
    spec.mode = boxhost::plan::MountMode::ReadOnly;
    let probe = probe("host-root", &spec, "test -d /proc && echo started").await;
    assert!(probe.output.contains("started"), "{}", probe.output);
    if probe
        .envelope
        .hardening
        .namespaces
        .contains(&"mount".to_owned())
    {
        let not_applied =
            serde_json::to_value(&probe.envelope.limits).unwrap()["notApplied"].to_string();
        assert!(
            not_applied
                .contains("host directory not hidden (/: the unit's workspace is the host's root)"),
            "{not_applied}"
        );
        assert!(!not_applied.contains("no mount namespace"), "{not_applied}");
    }
}

/// Issue 8, item 3, as reported: `cd /tmp && box run --backend local -- true`.
#[test]
fn box_run_from_a_top_level_directory_starts() {
    if !require_landlock() {
        return;
    }
    let output = std::process::Command::new(box_bin())
        .args(["run", "--backend", "local", "--", "true"])
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Issue 8, item 4, as reported: `cd /etc && box run -- sh -c 'test -w
/// /workspace/passwd && echo W'` printed `W`. A `cwd` that resolves to a
/// system directory or `/` is refused on every backend before anything
/// starts, naming the field and the resolved path.
#[tokio::test]
async fn box_run_from_a_system_directory_is_refused_on_every_backend() {
    let mut backends = vec!["local"];
    if crate::support::docker_answers().await {
        backends.push("docker");
    }
    for backend in backends {
        for (cwd, shown) in [("/etc", "/etc"), ("/", "/")] {
            let output = std::process::Command::new(box_bin())
                .args(["run", "--backend", backend, "--"])
                .args(["sh", "-c", "test -w /workspace/passwd && echo W"])
                .current_dir(cwd)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(125),
                "{backend} from {cwd}: stdout {stdout} stderr {stderr}"
            );
            assert!(!stdout.contains('W'), "{backend} from {cwd}: {stdout}");
            assert!(
                stderr.contains(&format!(
                    "workspace.source = \"cwd\" resolved to {shown}, which is the host's root or a system directory: refused as dangerous"
                )),
                "{backend} from {cwd}: {stderr}"
            );
        }
    }
}

/// What one `box serve` session on `backend` reports and shows of its
/// workspace unit's environment: the envelope's `envPassed`, and the
/// variables a `bash` call sees, started with exactly `host` as its own
/// environment.
fn session_environment(
    backend: &str,
    profiles: &Path,
    workspace: &Path,
    host: &[(&str, &str)],
) -> (Vec<String>, Vec<(String, String)>) {
    use std::io::Write as _;
    let key = "io.github.christopherdavenport.dax/executor";
    let mut child = std::process::Command::new(box_bin())
        .args([
            "serve",
            "--backend",
            backend,
            "--profile",
            "p",
            "--profiles",
        ])
        .arg(profiles)
        .arg("--workspace")
        .arg(workspace)
        .env_clear()
        .envs(host.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let requests = [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "env-test", "version": "0"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": "env"}}}),
    ];
    let mut stdin = child.stdin.take().unwrap();
    for request in &requests {
        writeln!(stdin, "{request}").unwrap();
    }
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let answer = |id: i64| {
        answers
            .iter()
            .find(|answer| answer["id"] == id)
            .unwrap_or_else(|| panic!("{backend}: no answer {id}: {stdout}\nstderr: {stderr}"))
    };
    let envelope = &answer(1)["result"]["capabilities"]["experimental"][key]["box"]["units"][0];
    let passed: Vec<String> = envelope["envPassed"]
        .as_array()
        .unwrap_or_else(|| panic!("{backend}: no envPassed in {}", answer(1)))
        .iter()
        .map(|name| name.as_str().unwrap().to_owned())
        .collect();
    let text = answer(2)["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let inside = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    (passed, inside)
}

/// Issue 8, item 8: both backends give a unit only what the profile lets
/// through plus what box itself sets (`PATH`, `HOME`, `TMPDIR`), the same
/// `envPassed` for the same profile, and the same variables seen from
/// inside (docker adds only its image's `ENV` and `HOSTNAME`). The host's
/// other variables (internal URLs, paths, box's own `RUST_LOG`) reach neither.
/// What the profile sets reaches the unit's tools even where the scrubber
/// would remove the name (`SSL_CERT_FILE`), as `envPassed` says.
#[tokio::test]
async fn the_same_profile_gives_the_same_environment_on_both_backends() {
    if !require_landlock() {
        return;
    }
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("p.toml"),
        "[workspace]\nlocal_userland = \"host\"\n[env]\nset = { UNIT_SET = \"from-profile\", SSL_CERT_FILE = \"/profile/ca.pem\", GIT_SSL_CAINFO = \"/profile/ca.pem\" }\npass = [\"LANG\", \"TERM\", \"UNIT_PASSED\", \"UNIT_ABSENT\"]\n",
    )
    .unwrap();
    let workspace = open_dir();
    let host = [
        ("PATH", "/canary/bin:/usr/bin:/bin"),
        ("HOME", "/canary-home"),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
        ("UNIT_PASSED", "passed"),
        ("PIP_INDEX_URL", "http://canary.internal/simple"),
        ("CONTAINER_NAME", "canary-container"),
        ("TF_CLI_CONFIG_FILE", "/canary/.terraformrc"),
        ("OLDPWD", "/canary-oldpwd"),
        ("RUST_LOG", "warn"),
    ];
    let mut expected: Vec<String> = [
        "UNIT_PASSED",
        "UNIT_SET",
        "SSL_CERT_FILE",
        "GIT_SSL_CAINFO",
        "HOME",
        "LANG",
        "PATH",
        "TERM",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(
        box_scrub::git_neutralisation()
            .into_iter()
            .map(|(name, _)| name),
    )
    .collect();
    expected.sort();
    let mut backends = vec!["local"];
    if crate::support::docker_answers().await {
        backends.push("docker");
    }
    let mut seen = Vec::new();
    for backend in backends {
        let (passed, inside) =
            session_environment(backend, profiles.path(), workspace.path(), &host);
        assert_eq!(passed, expected, "{backend}: envPassed");
        let get = |name: &str| {
            inside
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(get("UNIT_SET"), Some("from-profile"), "{backend}");
        // Names the scrubber removes from what a unit inherits reach its
        // tools when the profile sets them (a CA bundle for TLS clients).
        assert_eq!(get("SSL_CERT_FILE"), Some("/profile/ca.pem"), "{backend}");
        assert_eq!(get("GIT_SSL_CAINFO"), Some("/profile/ca.pem"), "{backend}");
        assert_eq!(get("UNIT_PASSED"), Some("passed"), "{backend}");
        assert_eq!(get("TERM"), Some("dumb"), "{backend}");
        for (name, value) in &host {
            if value.contains("canary") {
                assert!(
                    !inside.iter().any(|(_, seen)| seen.contains("canary")),
                    "{backend}: a host value ({name}) reached the unit: {inside:?}"
                );
            }
        }
        for name in [
            "PIP_INDEX_URL",
            "CONTAINER_NAME",
            "TF_CLI_CONFIG_FILE",
            "RUST_LOG",
            "UNIT_ABSENT",
        ] {
            assert_eq!(get(name), None, "{backend}: {name} reached the unit");
        }
        let mut names: Vec<String> = inside.into_iter().map(|(name, _)| name).collect();
        names.sort();
        names.dedup();
        seen.push((backend, names));
    }
    if let [(_, local), (_, docker)] = seen.as_slice() {
        // Docker's own hostname and what the image's ENV says (box-base sets
        // PATH, HOME and LANG, which the plan names too) are the only extras.
        let docker: Vec<&String> = docker.iter().filter(|name| *name != "HOSTNAME").collect();
        let local: Vec<&String> = local.iter().collect();
        assert_eq!(local, docker, "the variables seen from inside differ");
    }
}

/// With one mask fewer (none on `/sys/kernel/debug` under a `/sys` of the
/// unit's own, where nothing of the host's is mounted on it), nothing of the
/// kernel's debug file system is readable in a unit (C33).
#[tokio::test]
async fn kernel_debug_files_stay_out_of_reach() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe(
        "kernel-debug",
        &spec,
        "echo debug: $(ls -A /sys/kernel/debug 2>/dev/null | wc -l)",
    )
    .await;
    assert!(probe.output.contains("debug: 0"), "{}", probe.output);
}

/// `box run -t`: the command has a terminal of its own in the unit (a
/// /dev/pts of the unit's devpts, of this terminal's size), and box's exit
/// status is still the command's.
#[test]
fn box_run_t_gives_the_command_a_terminal_of_this_size() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let workspace_arg = workspace.path().to_str().unwrap();
    let outside = tempfile::tempdir().unwrap();
    // The terminal weakens nothing: the command is as confined as without one.
    let script = format!(
        "tty; stty size; grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; \
         (echo x > {}/escaped) 2>/dev/null || echo outside-denied; exit 7",
        outside.path().display()
    );
    let run = box_in_a_pty(
        &[
            "run",
            "--backend",
            "local",
            "--workspace",
            workspace_arg,
            "-t",
            "--",
            "sh",
            "-c",
            &script,
        ],
        (33, 111),
        "",
        None,
        "",
    );
    assert_eq!(run.status, 7, "{}", run.output);
    assert!(run.output.contains("/dev/pts/"), "{}", run.output);
    assert!(run.output.contains("33 111"), "{}", run.output);
    assert!(run.output.contains("NoNewPrivs:\t1"), "{}", run.output);
    assert!(run.output.contains("Seccomp:\t2"), "{}", run.output);
    assert!(run.output.contains("outside-denied"), "{}", run.output);
    assert!(!outside.path().join("escaped").exists());
}

/// `box run -it`: keys typed here reach the command byte for byte (this
/// terminal raw: no second echo), a resize here resizes the command's
/// terminal, and this terminal is cooked again once box exits.
#[test]
fn box_run_it_forwards_keys_and_resizes_and_restores_the_terminal() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let workspace_arg = workspace.path().to_str().unwrap();
    let run = box_in_a_pty(
        &[
            "run",
            "--backend",
            "local",
            "--workspace",
            workspace_arg,
            "-it",
            "sh",
            "-c",
            "stty size; echo READY; read line; echo got:$line; stty size",
        ],
        (33, 111),
        "READY",
        Some((44, 122)),
        "hello\n",
    );
    assert_eq!(run.status, 0, "{}", run.output);
    assert!(run.output.contains("33 111"), "{}", run.output);
    assert!(run.output.contains("got:hello"), "{}", run.output);
    assert!(run.output.contains("44 122"), "{}", run.output);
    // The unit's terminal echoes once; a cooked terminal here would echo again.
    assert_eq!(run.output.matches("hello").count(), 2, "{}", run.output);
    assert!(
        run.cooked_after,
        "the terminal was left raw: {}",
        run.output
    );
}

/// Issue 12: a local unit whose host lets its lease go (the renewal dropped,
/// as a stopped or hung host stops renewing) ends within the lease, every
/// process with it (a grandchild in its own session included), and its end
/// says why; a renewed unit outlives several leases first. Both of the
/// helper's ways to hold the lease: outside the unit's pid namespace, and as
/// the subreaper supervisor without one.
async fn let_go_ends_within_the_lease(backend: LocalBackend, name: &str) {
    let mut spec = unit_spec(Path::new("/nonexistent"));
    spec.source = WorkspaceSource::Empty;
    spec.lease = Duration::from_secs(1);
    let marker = format!("94{}{}", name.len(), std::process::id());
    let script = format!("setsid sleep {marker} & sleep {marker}");
    let command = vec![OsString::from("/bin/sh"), "-c".into(), script.into()];
    let started = backend
        .start_command(&session(name), &spec, command)
        .await
        .unwrap();
    assert_eq!(
        started.envelope.lifecycle,
        Some(boxhost::backend::AppliedLifecycle { lease_ms: 1000 }),
        "the envelope reports the lease"
    );
    let id = started.envelope.id.clone();
    let boxhost::backend::StartedUnit {
        ended, renewal, io, ..
    } = started;
    assert!(renewal.is_some(), "a local unit's lease is renewed");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewed past three leases: alive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(processes_with(&marker).len(), 2, "a renewed unit lives on");
    let let_go = std::time::Instant::now();
    drop(renewal);
    let end = tokio::time::timeout(Duration::from_secs(1 + 5), ended)
        .await
        .expect("the unit ended within its lease plus 5 s");
    eprintln!("{name}: let go, ended after {:?}", let_go.elapsed());
    assert!(end.reason.contains("lease lapsed"), "{}", end.reason);
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    drop(io);
    backend.remove(&id).await.unwrap();
}

#[tokio::test]
async fn a_local_unit_let_go_ends_within_its_lease() {
    if !require_landlock() {
        return;
    }
    let_go_ends_within_the_lease(backend(), "letgo").await;
}

#[tokio::test]
async fn a_local_unit_let_go_ends_within_its_lease_without_a_pid_namespace() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    let_go_ends_within_the_lease(backend, "letgo-flat").await;
}

/// Issue 12: the unit's key, which proves the host to the unit's helper and
/// the helper to the host, stays out of the unit: its run directory (socket,
/// key, record) is hidden by the unit's mount namespace, and landlock never
/// grants it where there is none. A process of the unit that looks for
/// every run directory under the host's runtime directory finds no key.
#[tokio::test]
async fn the_unit_key_and_the_run_directory_are_out_of_reach() {
    if !require_landlock() {
        return;
    }
    let units = boxhost::backend::default_runtime_dir().join("units");
    let script = format!(
        "for dir in {units}/*; do cat \"$dir/key\" && echo read-a-key; done; \
         ls {units} >/dev/null 2>&1 && echo listed-run-dirs; echo done",
        units = units.display()
    );
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let flat = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    });
    for (backend, name) in [(backend(), "keyless"), (flat, "keyless-flat")] {
        let probe = probe_with(&backend, name, &spec, &script).await;
        assert!(probe.output.contains("done"), "{name}: {}", probe.output);
        assert!(
            !probe.output.contains("read-a-key"),
            "{name}: {}",
            probe.output
        );
        assert!(
            !probe.output.contains("listed-run-dirs"),
            "{name}: {}",
            probe.output
        );
        let hex_word = probe
            .output
            .split_whitespace()
            .any(|word| word.len() == 64 && word.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(!hex_word, "{name}: a key in {}", probe.output);
    }
}

/// A profile directory with `pinned.toml`: the default workspace with a
/// pinned image of its own, and `extra` added under `[workspace]`.
fn pinned_profile(extra: &str) -> tempfile::TempDir {
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("pinned.toml"),
        format!(
            "description = \"a pinned image\"\nextends = \"default\"\n\n[workspace]\nimage = \"{PINNED}\"\n{extra}"
        ),
    )
    .unwrap();
    profiles
}

const PINNED: &str =
    "box-test-pinned@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Issue 22, item 4, as reported: a profile with a pinned image ran on the
/// local backend on the host's own userland, exit 0, no warning, its
/// envelope saying `"image": ""`. The local backend refuses it, naming the
/// field, the backend and the fix, and starts nothing.
#[test]
fn box_run_on_the_local_backend_refuses_an_image_it_cannot_give() {
    let profiles = pinned_profile("");
    let workspace = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(box_bin())
        .args(["run", "--backend", "local", "--profiles"])
        .arg(profiles.path())
        .args(["--profile", "pinned", "--workspace"])
        .arg(workspace.path())
        .args(["--", "/bin/sh", "-c", "echo ran > ran"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("unit workspace: workspace.image {PINNED}")),
        "{stderr}"
    );
    assert!(stderr.contains("the local backend"), "{stderr}");
    assert!(stderr.contains("local_userland = \"host\""), "{stderr}");
    assert!(!workspace.path().join("ran").exists(), "the command ran");
}

/// Issue 22, item 4: a profile that says `local_userland = "host"` runs on the
/// local backend, and its envelope says it runs the host's userland.
#[test]
fn a_unit_allowed_the_hosts_userland_says_so_in_its_envelope() {
    if !require_landlock() {
        return;
    }
    let profiles = pinned_profile("local_userland = \"host\"\n");
    let workspace = tempfile::tempdir().unwrap();
    let mut command = crate::support::serve_command(
        "local",
        &format!("userland-{}", std::process::id()),
        workspace.path(),
    );
    command
        .arg("--profiles")
        .arg(profiles.path())
        .args(["--profile", "pinned"]);
    let served = crate::support::Served::start(command);
    let envelope = &served.initialized["result"]["capabilities"]["experimental"]["io.github.christopherdavenport.dax/executor"]
        ["box"]["units"][0];
    assert_eq!(envelope["backend"], "local", "{envelope}");
    assert_eq!(envelope["userland"], "host", "{envelope}");
    assert_eq!(envelope["image"], "", "{envelope}");
    assert!(served.hang_up().success());
}

/// Issue 22, item 4: `box doctor` judges such a profile not runnable on the
/// local backend, and `--strict` fails naming why where no backend can run it.
#[test]
fn box_doctor_reports_an_image_the_local_backend_cannot_give() {
    let config = tempfile::tempdir().unwrap();
    let profiles = config.path().join("box/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    // Never pulled and not on the engine: docker cannot run it either.
    std::fs::write(
        profiles.join("pinned.toml"),
        format!("extends = \"default\"\n\n[workspace]\nimage = \"{PINNED}\"\npull = \"never\"\n"),
    )
    .unwrap();
    let doctor = |args: &[&str]| {
        std::process::Command::new(box_bin())
            .arg("doctor")
            .args(args)
            .env("XDG_CONFIG_HOME", config.path())
            .output()
            .unwrap()
    };
    let output = doctor(&["--json"]);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let judged = |name: &str| {
        report["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|profile| profile["name"] == name)
            .unwrap_or_else(|| panic!("{name} not judged: {report:#}"))
            .clone()
    };
    let local = judged("pinned")["local"].to_string();
    assert!(
        local.contains(&format!(
            "unit workspace: workspace.image {PINNED}: the local backend"
        )),
        "{local}"
    );
    assert!(
        !judged("default")["local"]
            .to_string()
            .contains("workspace.image"),
        "{report:#}"
    );
    let output = doctor(&["--strict", "--profile", "pinned"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("local: unit workspace: workspace.image {PINNED}")),
        "{stderr}"
    );
}

/// A unit spec with `volumes`, its volumes kept in `store`.
fn with_volumes(spec: &mut UnitSpec, volumes: &[(&str, &str, boxhost::plan::VolumeScope)]) {
    use boxhost::plan::{Volume, VolumePath};
    spec.volumes = volumes
        .iter()
        .map(|(name, path, scope)| Volume {
            scope: *scope,
            ..Volume::new(
                (*name).to_owned(),
                match path.strip_prefix("~/") {
                    Some(relative) => VolumePath::Home(relative.into()),
                    None => VolumePath::Absolute(path.into()),
                },
            )
        })
        .collect();
}

fn volume_session(name: &str) -> SessionLabel {
    SessionLabel {
        profile: format!("volumes-{}", std::process::id()),
        ..session(name)
    }
}

/// Start `script` in a unit of `session` and return what it printed.
async fn run_in(
    backend: &LocalBackend,
    session: &SessionLabel,
    spec: &UnitSpec,
    script: &str,
) -> (Envelope, String) {
    let script = format!("exec 2>&1; {script}");
    let command: Vec<OsString> = vec!["/bin/sh".into(), "-c".into(), script.into()];
    let started = backend
        .start_command(session, spec, command)
        .await
        .unwrap_or_else(|error| panic!("starting a unit of {}: {error}", session.session));
    let envelope = started.envelope.clone();
    let mut io = started.io;
    drop(io.stdin);
    let mut output = String::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        io.stdout.read_to_string(&mut output),
    )
    .await
    .expect("unit finished within 60s")
    .unwrap();
    backend.remove(&envelope.id).await.unwrap();
    eprintln!("{} output:\n{output}", session.session);
    (envelope, output)
}

/// A profile volume written in one session's unit is read by the next
/// session's; a session volume is that session's alone and goes with it. As
/// root, also for a unit that runs as another user (the volume's content is
/// that user's, the home keeps its owner).
#[tokio::test]
async fn a_profile_volume_outlives_the_session_and_a_session_volume_goes_with_it() {
    use boxhost::plan::VolumeScope;
    if !require_landlock() {
        return;
    }
    for as_nobody in [false, true] {
        if as_nobody && !nix::unistd::geteuid().is_root() {
            continue;
        }
        let state = tempfile::tempdir().unwrap();
        let store = boxhost::backend::volumes::VolumeStore::new(state.path().to_path_buf());
        let backend = backend().with_volume_store(store.clone());
        let workspace = open_dir();
        let mut spec = unit_spec(workspace.path());
        if as_nobody {
            unprivileged(&mut spec);
        }
        with_volumes(
            &mut spec,
            &[
                ("pip-cache", "~/.cache/pip", VolumeScope::Profile),
                ("scratch", "/var/cache/box-scratch", VolumeScope::Session),
            ],
        );
        let tag = if as_nobody { "nobody" } else { "caller" };
        let first = volume_session(&format!("vol-first-{tag}"));
        let (envelope, output) = run_in(
            &backend,
            &first,
            &spec,
            "echo wheel > $HOME/.cache/pip/wheel && echo mine > /var/cache/box-scratch/mine \
             && stat -c 'home %u' $HOME && stat -c 'cache %u' $HOME/.cache && stat -c 'data %u' $HOME/.cache/pip \
             && echo wrote",
        )
        .await;
        assert!(output.contains("wrote"), "{output}");
        let uid = envelope.user.split(':').next().unwrap().to_owned();
        for line in ["home", "cache", "data"] {
            assert!(
                output.contains(&format!("{line} {uid}\n")),
                "{line} owned by {uid}: {output}"
            );
        }
        let listed: Vec<(String, &str)> = envelope
            .volumes
            .iter()
            .map(|volume| (volume.name.clone(), volume.scope.as_str()))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("pip-cache".to_owned(), "profile"),
                ("scratch".to_owned(), "session")
            ]
        );
        assert_eq!(
            envelope.volumes[0].shared_with.as_deref(),
            Some(first.profile.as_str())
        );
        assert_eq!(envelope.volumes[1].path, "/var/cache/box-scratch");
        // The first session's unit is gone: its session volume with it.
        let keys: Vec<String> = store.list().into_iter().map(|volume| volume.key).collect();
        assert_eq!(
            keys,
            vec![format!("p-{}-pip-cache", first.profile)],
            "{tag}"
        );
        let wheel = state.path().join("local").join(&keys[0]).join("data/wheel");
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&wheel).unwrap().uid().to_string(), uid);

        let next = volume_session(&format!("vol-next-{tag}"));
        let (_, output) = run_in(
            &backend,
            &next,
            &spec,
            "cat $HOME/.cache/pip/wheel; ls -A /var/cache/box-scratch; echo listed",
        )
        .await;
        assert_eq!(output, "wheel\nlisted\n", "{tag}");
        assert_eq!(store.list().len(), 1);
    }
}

/// The helper holds a volume's lock while its unit lives: removal is
/// refused until the unit is gone.
#[tokio::test]
async fn a_volume_in_use_is_not_removed() {
    use boxhost::plan::VolumeScope;
    if !require_landlock() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let store = boxhost::backend::volumes::VolumeStore::new(state.path().to_path_buf());
    let backend = backend().with_volume_store(store.clone());
    let mut spec = unit_spec(Path::new("/nonexistent"));
    spec.source = WorkspaceSource::Empty;
    with_volumes(
        &mut spec,
        &[("cache", "~/.cache/thing", VolumeScope::Profile)],
    );
    let session = volume_session("vol-held");
    let command = vec![OsString::from("/bin/sh"), "-c".into(), "sleep 60".into()];
    let started = backend
        .start_command(&session, &spec, command)
        .await
        .unwrap();
    let volume = store.list().remove(0);
    assert!(boxhost::backend::volumes::in_use_locally(&volume));
    let refused = boxhost::backend::volumes::remove(&volume).unwrap_err();
    assert!(refused.contains("in use by a running unit"), "{refused}");
    assert!(volume.dir.join("data").is_dir());
    backend.remove(&started.envelope.id).await.unwrap();
    boxhost::backend::volumes::remove(&volume).unwrap();
    assert!(store.list().is_empty());
}

/// Without a mount namespace a volume beneath the home is a link to its
/// directory, and the envelope says so; one elsewhere is refused, naming it.
#[tokio::test]
async fn without_a_mount_namespace_a_home_volume_is_linked_and_another_refused() {
    use boxhost::plan::VolumeScope;
    if !require_landlock() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let store = boxhost::backend::volumes::VolumeStore::new(state.path().to_path_buf());
    let flat = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
        temp_root: boxhost::backend::local::default_temp_root(),
    })
    .with_volume_store(store.clone());
    let mut spec = unit_spec(Path::new("/nonexistent"));
    spec.source = WorkspaceSource::Empty;
    with_volumes(
        &mut spec,
        &[("cache", "~/.cache/thing", VolumeScope::Profile)],
    );
    let session = volume_session("vol-flat");
    let (envelope, output) = run_in(
        &flat,
        &session,
        &spec,
        "echo kept > $HOME/.cache/thing/kept && echo wrote",
    )
    .await;
    assert!(output.contains("wrote"), "{output}");
    assert_eq!(envelope.volumes.len(), 1);
    let boxhost::backend::AppliedLimits::Process(limits) = &envelope.limits else {
        panic!("local limits are per process");
    };
    assert!(
        limits
            .not_applied
            .iter()
            .any(|line| line.starts_with("volume cache: no mount namespace")),
        "{:?}",
        limits.not_applied
    );
    let data = store.list().remove(0).dir.join("data");
    assert_eq!(
        std::fs::read_to_string(data.join("kept")).unwrap(),
        "kept\n"
    );

    with_volumes(
        &mut spec,
        &[("scratch", "/var/cache/box-scratch", VolumeScope::Session)],
    );
    let command = vec![OsString::from("/bin/true")];
    let Err(error) = flat.start_command(&session, &spec, command).await else {
        panic!("a volume outside the home started without a mount namespace");
    };
    assert!(
        matches!(&error, BackendError::Unenforceable { control, why, .. }
            if control == "volume \"scratch\"" && why.contains("mount namespace of its own")),
        "{error}"
    );
}
